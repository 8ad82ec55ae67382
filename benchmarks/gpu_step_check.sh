#!/usr/bin/env bash
# GRPO steps of the real trainer (train_grpo.sh -> verl.trainer.main_ppo, trainer.backend=local, the HF rollout
# engine) on a CUDA machine in bfloat16, with the demo's BM25 retrieval service on loopback; figures, not pass/fail.
#
#   OUT=DIR bash benchmarks/gpu_step_check.sh        # from the repository root
#
#   (a) tag     3 steps of the tiny demo policy, the tag format (configs/demo.yaml): score, searches per trajectory
#   (c) smollm  3 steps of a model of SmolLM2-135M-Instruct's shape with random weights (built here from
#               .gpumodel/smollm2-135m-instruct: config.json and tokenizer files), demo-real's batch (6 prompts x 4)
#               and lengths (scripts/demo_real.sh): the trainer's timing/* and perf/* (perf/mfu/*) metrics
#   (b) hermes  the (a) run with actor_rollout_ref.rollout.multi_turn.format=hermes, on the demo questions made again
#               under the hermes prompt (data_prep.retemplate)
# run in that order (the figures of (c) matter more than (b)'s), each under `timeout`; the whole script is budgeted
# to finish within about 7 minutes (GPU_CHECK_BUDGET).
#
# Carried (git-ignored) in the repository root: .whl/ (wheels the machine lacks, `make gpu-wheels`: omegaconf, jsonschema
# and its deps, fastapi, starlette, pydantic, uvicorn, httptools, bm25s, pytest; .whl/if_older/ holds typing_extensions
# and anyio, installed only where the machine's copy is older than the others need), .gpumodel/ and .gpudata/demo (the demo
# data, BM25 index and the warm-started tiny policy; anything missing there is built: data and index in seconds, the
# tiny policy by a short warm start of GPU_CHECK_WARM_STEPS steps).
#
# Environment: OUT (default outputs/gpu_step_check; files: summary.txt, logs.txt, {tag,hermes,smollm}_metrics.jsonl),
# GPU_CHECK_DEVICE (cuda; cpu for a trial run elsewhere), GPU_CHECK_STEPS (3), PYTHON (the path of python3),
# GPU_CHECK_SITE (/tmp/site: where the wheels go), GPU_CHECK_WORK (/tmp/gpu_check: run directories),
# GPU_CHECK_PORT (8731), GPU_CHECK_PARTS (tag,smollm,hermes), GPU_CHECK_DATA (.gpudata/demo),
# GPU_CHECK_WARM_STEPS (300) and GPU_CHECK_WARM_COPY (300: copy-task steps at most) of a warm start there (on the CPU;
# the demo's own 2500-step warm start takes minutes, so carry it), GPU_CHECK_BUDGET (390: seconds from the start after
# which no run starts; a run's timeout is cut to what is left), GPU_CHECK_EXTRA (key=value overrides appended to every
# run, space-separated: e.g. smaller batches for a trial on a CPU).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
START=$(date +%s)
OUT=${OUT:-outputs/gpu_step_check}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
STEPS=${GPU_CHECK_STEPS:-3}
PYTHON=${PYTHON:-$(command -v python3)}  # a path: scripts/launch_common.sh falls back to `python` unless [ -x ]
SITE=${GPU_CHECK_SITE:-/tmp/site}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
PORT=${GPU_CHECK_PORT:-8731}
PARTS=${GPU_CHECK_PARTS:-tag,smollm,hermes}
BUDGET=${GPU_CHECK_BUDGET:-390}
EXTRA=${GPU_CHECK_EXTRA:-}
DATA=${GPU_CHECK_DATA:-.gpudata/demo}
MODEL_SRC=.gpumodel/smollm2-135m-instruct
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT" "$WORK"
SUMMARY=$OUT/summary.txt
LOGS=$OUT/logs.txt
: > "$SUMMARY"; : > "$LOGS"
say() { echo "[gpu-check $(( $(date +%s) - START ))s] $*" | tee -a "$SUMMARY"; }
export PYTHONUNBUFFERED=1 PYTHON

# ---- wheels: the packages the trainer and the BM25 service import that the machine lacks
source benchmarks/gpu_site.sh
carried_site "$SITE" > "$WORK/install.log" 2>&1
tee -a "$SUMMARY" < "$WORK/install.log"
say "installed ($(du -sh "$SITE" 2>/dev/null | cut -f1) in $SITE); PYTHONPATH=$PYTHONPATH"

# ---- machine and versions
{ nvidia-smi 2>&1 || echo "(no nvidia-smi)"; } | tee -a "$SUMMARY"
nproc | sed 's/^/cpu cores: /' | tee -a "$SUMMARY"
timeout 120 "$PYTHON" benchmarks/gpu_step_check.py versions 2>&1 | tee -a "$SUMMARY"
[ "${PIPESTATUS[0]}" = 0 ] || say "WARNING: an import failed (above); the runs below will show where"

# ---- demo data, BM25 index, tiny policy (carried in .gpudata/demo, else built)
if [ ! -f "$DATA/train.parquet" ]; then
  say "building the demo knowledge base in $DATA"
  timeout 60 "$PYTHON" -m data_prep.demo_kb --out "$DATA" >> "$LOGS" 2>&1 || say "demo_kb failed (see logs.txt)"
fi
if [ ! -f "$DATA/index_bm25/manifest.json" ]; then
  say "building the BM25 index in $DATA/index_bm25"
  timeout 60 "$PYTHON" -m retrieval_server.build_index --corpus "$DATA/corpus.jsonl" --out "$DATA/index_bm25" \
    --retriever bm25 >> "$LOGS" 2>&1 || say "build_index failed (see logs.txt)"
fi
for split in train test; do
  [ -f "$DATA/hermes/$split.parquet" ] || timeout 60 "$PYTHON" -m data_prep.retemplate --format hermes \
    --data "$DATA/$split.parquet" --out "$DATA/hermes/$split.parquet" >> "$LOGS" 2>&1
done

# ---- the retrieval service (retrieval_launch.sh: the index is never rebuilt there)
echo "==== retrieval service" >> "$LOGS"
CORPUS=$DATA/corpus.jsonl INDEX_DIR=$DATA/index_bm25 PORT=$PORT PYTHON=$PYTHON \
  bash retrieval_launch.sh --log-interval 0 > "$WORK/retrieval.log" 2>&1 &
SERVICE_PID=$!
cleanup() { kill "$SERVICE_PID" 2>/dev/null; wait "$SERVICE_PID" 2>/dev/null; tail -n 15 "$WORK/retrieval.log" >> "$LOGS"; }
trap cleanup EXIT
if ! "$PYTHON" benchmarks/gpu_step_check.py wait "$URL" 90 "$SERVICE_PID" | tee -a "$SUMMARY"; then
  say "the retrieval service did not start; its log:"; tail -n 30 "$WORK/retrieval.log" | tee -a "$SUMMARY"; exit 1
fi
say "retrieval service up at $URL"

if [ ! -f "$DATA/tiny_policy/config.json" ] && [[ ",$PARTS," == *",tag,"* || ",$PARTS," == *",hermes,"* ]]; then
  warm=${GPU_CHECK_WARM_STEPS:-300}
  say "warm-starting the tiny policy ($warm steps, copy task at most 300; not the demo's 2500: a shorter policy"\
      "searches less often)"
  t0=$(date +%s)
  timeout 150 "$PYTHON" -m data_prep.tiny_policy --data "$DATA" --out "$DATA/tiny_policy" --retriever-url "$URL" \
    --steps "$warm" --copy-steps "${GPU_CHECK_WARM_COPY:-300}" >> "$LOGS" 2>&1 || say "warm start failed or timed out (see logs.txt)"
  say "warm start took $(( $(date +%s) - t0 )) s"
fi

# ---- the runs
COMMON=(trainer.device="$DEVICE" trainer.backend=local actor_rollout_ref.rollout.name=hf
        actor_rollout_ref.actor.fsdp_config.dtype=bfloat16 actor_rollout_ref.rollout.dtype=bfloat16
        retriever.url="$URL" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
        trainer.test_freq=-1 trainer.save_freq=-1 trainer.logger=[console,jsonl] trainer.resume_mode=disable)
run_part() {  # NAME SECONDS ARGS...: one train_grpo.sh run under timeout; its figures, metrics and log tail to $OUT
  local name=$1 seconds=$2; shift 2
  case ",$PARTS," in *",$name,"*) ;; *) say "($name skipped: GPU_CHECK_PARTS=$PARTS)"; return;; esac
  local left=$(( BUDGET - ($(date +%s) - START) ))  # the whole script within BUDGET seconds
  [ "$left" -lt "$seconds" ] && seconds=$left
  if [ "$seconds" -lt 30 ]; then say "($name skipped: ${left}s left of the budget)"; return; fi
  local dir=$WORK/$name; rm -rf "$dir"
  say "---- $name: $STEPS GRPO steps, timeout ${seconds}s"
  local t0=$(date +%s) status=0
  timeout "$seconds" bash train_grpo.sh --config configs/demo.yaml "${COMMON[@]}" trainer.default_local_dir="$dir" \
    "$@" $EXTRA > "$WORK/$name.log" 2>&1 || status=$?
  say "$name: exit $status after $(( $(date +%s) - t0 )) s$([ $status = 124 ] && echo ' (TIMED OUT)')"
  grep -E "^(run|model|rollout|data|batch|search|retriev|turns|tools?) " "$WORK/$name.log" | head -12 | tee -a "$SUMMARY"
  grep -E "^step [0-9]+ " "$WORK/$name.log" | tail -n "$STEPS" | tee -a "$SUMMARY"
  grep -E "Error|Traceback|error:" "$WORK/$name.log" | tail -n 5 | tee -a "$SUMMARY"
  "$PYTHON" benchmarks/gpu_step_check.py report "$name" "$dir" 2>&1 | tee -a "$SUMMARY"
  [ -f "$dir/metrics.jsonl" ] && cp "$dir/metrics.jsonl" "$OUT/${name}_metrics.jsonl"
  { echo "==== $name (exit $status): last 60 lines of its log"; tail -n 60 "$WORK/$name.log"; } >> "$LOGS"
}

run_part tag 90 actor_rollout_ref.model.path="$DATA/tiny_policy" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet"

if [[ ",$PARTS," == *",smollm,"* ]]; then
  if [ -f "$MODEL_SRC/config.json" ]; then
    timeout 90 "$PYTHON" benchmarks/gpu_step_check.py random-model "$MODEL_SRC" "$WORK/smollm_random" 2>&1 \
      | tee -a "$SUMMARY"
  else
    say "no $MODEL_SRC/config.json: part smollm cannot run"
  fi
fi
# scripts/demo_real.sh's batch and lengths (tag format), 3 steps
run_part smollm 170 actor_rollout_ref.model.path="$WORK/smollm_random" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  data.max_obs_length=256 data.max_prompt_length=1024 data.max_response_length=320 data.max_trajectory_length=640 \
  data.train_batch_size=6 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=24 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.actor.optim.lr=1e-5

# the hermes prompt carries the tool schema: longer than configs/demo.yaml's max_start_length (as demo_real.sh sets)
run_part hermes 90 actor_rollout_ref.model.path="$DATA/tiny_policy" \
  data.train_files="$DATA/hermes/train.parquet" data.val_files="$DATA/hermes/test.parquet" \
  actor_rollout_ref.rollout.multi_turn.format=hermes data.max_prompt_length=1024 data.max_start_length=1024

say "done in $(( $(date +%s) - START )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
