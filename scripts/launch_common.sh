# Sourced by train_ppo.sh and train_grpo.sh: make the embedded demo ready, then run the trainer.
# Demo data, the retrieval service and the tiny policy are prepared only when the arguments do not
# point the run elsewhere (data.train_files=..., actor_rollout_ref.model.path=...). A service
# started here is stopped when the launcher exits.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python
DEMO_DIR=data/demo  # the config's default data and model paths point here

arg_value() {  # arg_value KEY ARGS... -> value of the last KEY=value argument, or empty
  local key=$1 value="" a; shift
  for a in "$@"; do [[ $a == "$key="* ]] && value=${a#"$key="}; done
  echo "$value"
}

demo_source_hash() {  # the code the demo data and tiny policy are built from
  cat data_prep/demo_kb.py data_prep/tiny_model.py data_prep/tiny_policy.py | sha256sum | cut -d' ' -f1
}

run_trainer() {
  local url model train
  url=$(arg_value retriever.url "$@"); url=${url:-http://127.0.0.1:8000}
  model=$(arg_value actor_rollout_ref.model.path "$@")
  train=$(arg_value data.train_files "$@")
  if [ -z "$train" ] && [ -d "$DEMO_DIR" ] && [ "$(cat "$DEMO_DIR/.source_hash" 2>/dev/null)" != "$(demo_source_hash)" ]; then
    # Built by other code (e.g. before a git pull): rebuild data, index and policy rather than mix versions.
    if curl -sf "$url/health" >/dev/null 2>&1; then
      echo "[launcher] $DEMO_DIR was built by older code, but a retrieval service is running on $url (maybe over" \
           "the old corpus): stop it, then run again" >&2
      exit 1
    fi
    echo "[launcher] $DEMO_DIR was built by older code: rebuilding it"
    rm -rf "$DEMO_DIR"
  fi
  if [ -z "$train" ] && [ ! -f "$DEMO_DIR/train.parquet" ]; then
    echo "[launcher] building the demo knowledge base in $DEMO_DIR"
    "$PYTHON" -m data_prep.demo_kb --out "$DEMO_DIR"
    demo_source_hash > "$DEMO_DIR/.source_hash"
  fi
  if [ "$(arg_value do_search "$@")" != "false" ] && ! curl -sf "$url/health" >/dev/null 2>&1; then
    local port=${url##*:}; port=${port%%/*}
    echo "[launcher] retrieval service not answering at $url: starting retrieval_launch.sh on port $port"
    PORT=$port PYTHON=$PYTHON bash retrieval_launch.sh > "${RETRIEVAL_LOG:-retrieval_server.log}" 2>&1 &
    SERVICE_PID=$!
    # Wait for it to exit, so that a launcher run right after this one finds the port free and starts its own.
    # The trap runs under `set -e` and must not fail: `wait` returns the stopped service's 143, and that status
    # would otherwise become the launcher's (a successful run ending in `make: *** Error 143`). The launcher's
    # own status, the trainer's, is kept.
    trap 'status=$?; { kill $SERVICE_PID && wait $SERVICE_PID; } 2>/dev/null || true; exit $status' EXIT
    for _ in $(seq 1 600); do
      curl -sf "$url/health" >/dev/null 2>&1 && break
      kill -0 $SERVICE_PID 2>/dev/null || { echo "[launcher] retrieval service failed, see retrieval_server.log"; exit 1; }
      sleep 1
    done
  fi
  if [ -z "$model" ] && [ ! -f "$DEMO_DIR/tiny_policy/config.json" ]; then
    echo "[launcher] warm-starting the tiny demo policy in $DEMO_DIR/tiny_policy"
    "$PYTHON" -m data_prep.tiny_policy --data "$DEMO_DIR" --out "$DEMO_DIR/tiny_policy" --retriever-url "$url"
  fi
  "$PYTHON" -m verl.trainer.main_ppo "$@"
}
