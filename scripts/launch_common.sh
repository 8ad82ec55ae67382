# Sourced by train_ppo.sh and train_grpo.sh: `run_trainer DEMO_NAME LAUNCHER_CONFIG ARGS...`, where
# LAUNCHER_CONFIG is the launcher's own YAML layer ("" for none; train_grpo.sh: configs/grpo.yaml) and ARGS are the
# user's: key=value overrides, --config FILE, --wait-for-retriever SECONDS.
#
# Demo mode: when no argument names data, a model, a service or a config file (data.train_files, data.val_files,
#   actor_rollout_ref.model.path, critic.model.path, retriever.url, --config), the embedded demo is prepared here:
#   its knowledge base, a BM25 retrieval service over it (stopped when the launcher exits) and the warm-started tiny
#   policy; the trainer gets configs/demo.yaml and trainer.experiment_name=DEMO_NAME. Demo mode runs under the pinned
#   numerics of configs/demo_numerics.env. DEMO_SEED=S (default 0; `make demo SEED=S`) builds the warm start with
#   seed S (data/demo/tiny_policy, or tiny_policy_seedS) and trains with trainer.seed=data.seed=S+1, as
#   benchmarks/ablations.py does; DEMO_PORT (default 8000) is the port of the demo's retrieval service;
#   DEMO_WARM_START_ARGS adds arguments to the warm start (e.g. "--steps 1500"; ablations.py reads it too; a policy
#   warm-started with other arguments is warm-started again, not reused);
#   DEMO_PREPARE_ONLY=1 stops once data, service and policy are ready.
# Otherwise nothing is prepared and nothing is substituted: the run uses what the arguments name, and a retrieval
#   service that does not answer at retriever.url is an error (exit 2) naming the URL and how to start one, unless
#   --wait-for-retriever SECONDS waits for a service that is still loading. A missing model or data file is reported
#   by the trainer (exit 2).
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python
DEMO_DIR=data/demo  # configs/demo.yaml points here

demo_source_hash() {  # the code the demo data and tiny policy are built from (its warm start runs main_sft: the SFT
  # trainer's own files count; the modules it shares with RL, such as train_utils.py, do not)
  cat data_prep/demo_kb.py data_prep/tiny_model.py data_prep/tiny_policy.py data_prep/warm_start_sft.py \
    verl/trainer/sft_trainer.py verl/utils/sft_dataset.py verl/workers/shared_prefix.py configs/demo_numerics.env |
    sha256sum | cut -d' ' -f1
}

health_ok() { curl -sf "$1/health" >/dev/null 2>&1; }

run_trainer() {
  local demo_name=$1 own=() ; [ -z "$2" ] || own=(--config "$2"); shift 2
  local args=() configs=() wait_s="" url="" do_search=true user_points=""
  for arg in "$@"; do  # help before anything is prepared
    if [ "$arg" = "-h" ] || [ "$arg" = "--help" ]; then
      echo "usage: bash $(basename "$0") [--wait-for-retriever SECONDS] [--config FILE ...] key=value ..."
      echo "  no argument naming data, a model, a service or a config file: the embedded demo (prepared here)"
      echo "  otherwise: python -m verl.trainer.main_ppo with the arguments unchanged, whose help follows"
      echo
      exec "$PYTHON" -m verl.trainer.main_ppo --help
    fi
  done
  while [ $# -gt 0 ]; do
    case $1 in
      --wait-for-retriever) [ $# -ge 2 ] || { echo "[launcher] error: --wait-for-retriever needs SECONDS" >&2; exit 2; }
                            wait_s=$2; shift 2; continue ;;
      --wait-for-retriever=*) wait_s=${1#*=}; shift; continue ;;
      --config) [ $# -ge 2 ] || { echo "[launcher] error: --config needs a YAML file" >&2; exit 2; }
                configs+=(--config "$2"); user_points+=" --config"; shift 2; continue ;;
      --config=*) configs+=(--config "${1#*=}"); user_points+=" --config"; shift; continue ;;
    esac
    local key=${1%%=*}; key=${key#"${key%%[!+]*}"}  # Hydra's +key / ++key name the same key
    case $key in
      data.train_files|data.val_files|actor_rollout_ref.model.path|critic.model.path) user_points+=" $key" ;;
      retriever.url) user_points+=" $key"; url=${1#*=} ;;
      do_search) do_search=${1#*=} ;;
      max_turns) if [ "${1#*=}" = 0 ]; then do_search=false; fi ;;  # search disabled (R1): no service needed
    esac
    args+=("$1"); shift
  done
  if ! [[ -z $wait_s || $wait_s =~ ^[0-9]+$ ]]; then
    echo "[launcher] error: --wait-for-retriever $wait_s: a whole number of seconds is allowed" >&2; exit 2
  fi
  local user_url=$url  # user mode: no default (the trainer refuses a search run without retriever.url)
  url=${url:-http://127.0.0.1:${DEMO_PORT:-8000}}; url=${url%/}; url=${url%/retrieve}  # Search-R1 writes /retrieve

  if [ -n "$user_points" ]; then
    if [ "$do_search" != false ] && [ -n "$user_url" ] && ! health_ok "$url"; then
      if [ -n "$wait_s" ]; then
        echo "[launcher] waiting up to ${wait_s} s for the retrieval service at $url"
        local waited=0
        until health_ok "$url"; do
          if [ "$waited" -ge "$wait_s" ]; then
            echo "[launcher] error: no retrieval service answered at $url/health within ${wait_s} s" >&2; exit 2
          fi
          sleep 1; waited=$((waited + 1))
        done
      else
        echo "[launcher] error: no retrieval service answers at $url/health. Your arguments name your own" \
             "parts (${user_points# }), so this launcher starts none of the demo's: start your service first," \
             "e.g. CORPUS=corpus.jsonl INDEX_DIR=my_index PORT=${url##*:} bash retrieval_launch.sh, or pass" \
             "--wait-for-retriever SECONDS while it loads (do_search=false trains without search)" >&2
        exit 2
      fi
    fi
    exec "$PYTHON" -m verl.trainer.main_ppo "${own[@]}" "${configs[@]}" "${args[@]}"
  fi

  # ---- demo mode
  local seed=${DEMO_SEED:-0}
  if ! [[ $seed =~ ^[0-9]+$ ]]; then echo "[launcher] error: DEMO_SEED=$seed: a whole number is allowed" >&2; exit 2; fi
  local policy=$DEMO_DIR/tiny_policy; [ "$seed" = 0 ] || policy=${policy}_seed$seed
  [ "$seed" = 0 ] || demo_name=${demo_name}_seed$seed
  set -a; source configs/demo_numerics.env; set +a
  if [ -d "$DEMO_DIR" ] && [ "$(cat "$DEMO_DIR/.source_hash" 2>/dev/null)" != "$(demo_source_hash)" ]; then
    # Built by other code (e.g. before a git pull): rebuild data, index and policy rather than mix versions.
    if health_ok "$url"; then
      echo "[launcher] $DEMO_DIR was built by older code, but a retrieval service is running on $url (maybe over" \
           "the old corpus): stop it, then run again" >&2
      exit 1
    fi
    echo "[launcher] $DEMO_DIR was built by older code: rebuilding it"
    rm -rf "$DEMO_DIR"
  fi
  if [ ! -f "$DEMO_DIR/train.parquet" ]; then
    echo "[launcher] building the demo knowledge base in $DEMO_DIR"
    "$PYTHON" -m data_prep.demo_kb --out "$DEMO_DIR"
    demo_source_hash > "$DEMO_DIR/.source_hash"
  fi
  if [ "$do_search" != false ] && ! health_ok "$url"; then
    local port=${url##*:}; port=${port%%/*}
    echo "[launcher] starting the demo's retrieval service (retrieval_launch.sh) on port $port"
    PORT=$port PYTHON=$PYTHON bash retrieval_launch.sh > "${RETRIEVAL_LOG:-retrieval_server.log}" 2>&1 &
    SERVICE_PID=$!
    # Wait for it to exit, so that a launcher run right after this one finds the port free and starts its own.
    # The trap runs under `set -e` and must not fail: `wait` returns the stopped service's 143, and that status
    # would otherwise become the launcher's (a successful run ending in `make: *** Error 143`). The launcher's
    # own status, the trainer's, is kept.
    trap 'status=$?; { kill $SERVICE_PID && wait $SERVICE_PID; } 2>/dev/null || true; exit $status' EXIT
    for _ in $(seq 1 600); do
      health_ok "$url" && break
      kill -0 $SERVICE_PID 2>/dev/null || { echo "[launcher] retrieval service failed, see retrieval_server.log"; exit 1; }
      sleep 1
    done
  fi
  # The policy is reused only if it was warm-started with the same DEMO_WARM_START_ARGS (recorded in
  # $policy/.warm_start_args; none recorded = none given), never a short experiment's policy as the demo's.
  local ws_args; ws_args=$(echo ${DEMO_WARM_START_ARGS:-})
  if [ -f "$policy/config.json" ] && [ "$(cat "$policy/.warm_start_args" 2>/dev/null || true)" != "$ws_args" ]; then
    echo "[launcher] $policy was warm-started with other arguments" \
         "('$(cat "$policy/.warm_start_args" 2>/dev/null || true)', now '$ws_args'): warm-starting it again"
    rm -rf "$policy"
  fi
  if [ ! -f "$policy/config.json" ]; then
    echo "[launcher] warm-starting the tiny demo policy in $policy (seed $seed)"
    "$PYTHON" -m data_prep.tiny_policy --data "$DEMO_DIR" --out "$policy" --retriever-url "$url" --seed "$seed" \
      $ws_args
    [ -z "$ws_args" ] || echo "$ws_args" > "$policy/.warm_start_args"
  fi
  [ -z "${DEMO_PREPARE_ONLY:-}" ] || { echo "[launcher] demo prepared: $policy"; exit 0; }
  "$PYTHON" -m verl.trainer.main_ppo "${own[@]}" --config configs/demo.yaml \
    trainer.experiment_name="$demo_name" actor_rollout_ref.model.path="$policy" retriever.url="$url" \
    trainer.seed=$((seed + 1)) data.seed=$((seed + 1)) "${args[@]}"
}
