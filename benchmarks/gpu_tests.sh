#!/usr/bin/env bash
# The GPU test tier (`make test-gpu`: tests/gpu, the tests marked gpu) on a CUDA machine without package registries,
# ending in a one-screen summary (one line per test, the slowest, the exit status). Pass or fail, unlike the
# benchmarks' figures: the exit status is pytest's.
#
#   make gpu-wheels                                   # here, once: the wheels the GPU machine lacks, into .whl/
#   OUT=DIR bash benchmarks/gpu_tests.sh [PYTEST ARGS]   # there, from the repository root, with .whl carried
#
# Environment: OUT (outputs/gpu_tests: summary.txt is the screen, pytest.log the whole output, install.log),
# PYTHON (the path of python3), GPU_TESTS_SITE (/tmp/site: where the wheels go), GPU_TESTS_BUDGET (330: seconds
# pytest may run before it is stopped), GPU_TESTS_TEST_TIMEOUT (150: seconds one test may run before it fails),
# GPU_TESTS_DEVICE=cpu: a trial of this script and the tier where there is no GPU (the tests run on the CPU, see
# tests/conftest.py; PYTHON's own packages are used, and the project's metadata comes from a temporary site alone,
# as there), GPU_TESTS_HIDE (in the trial "ray,faiss,vllm,dashscope,openai,wandb", else none): packages made
# unimportable, absent from the GPU machine (not datasets, also absent there: libraries that ask importlib.metadata
# whether it is installed would still see it).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
START=$(date +%s)
OUT=${OUT:-outputs/gpu_tests}
PYTHON=${PYTHON:-$(command -v python3)}
SITE=${GPU_TESTS_SITE:-/tmp/site}
BUDGET=${GPU_TESTS_BUDGET:-330}
TRIAL=$([ "${GPU_TESTS_DEVICE:-cuda}" = cpu ] && echo 1 || echo 0)
HIDE=${GPU_TESTS_HIDE-$([ "$TRIAL" = 1 ] && echo ray,faiss,vllm,dashscope,openai,wandb)}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
say() { echo "[gpu-tests $(( $(date +%s) - START ))s] $*" | tee -a "$SUMMARY"; }
export PYTHONUNBUFFERED=1 PYTHON

if [ "$TRIAL" = 1 ]; then
  # As there, the checkout is imported through PYTHONPATH, not installed: its metadata (the recipe's entry point)
  # comes from a site of its own (project_metadata), and the copy installed here is hidden below
  say "trial on the CPU (GPU_TESTS_DEVICE=cpu): $PYTHON's own packages, nothing installed but the project's metadata"
  source benchmarks/gpu_site.sh
  SITE=$(mktemp -d)
  project_metadata "$SITE" > "$OUT/install.log" 2>&1
  export PYTHONPATH=$SITE:$PWD
else
  source benchmarks/gpu_site.sh
  carried_site "$SITE" > "$OUT/install.log" 2>&1
  say "carried wheels installed in $SITE ($(grep -c . "$OUT/install.log") lines in install.log)"
fi
if [ -n "$HIDE" ] || [ "$TRIAL" = 1 ]; then  # a sitecustomize, first on the path of every process here
  hidden=$(mktemp -d)
  # sys.modules[name] = None: `import name` fails as for a package that is not installed, and importlib.util.find_spec
  # (how libraries ask whether a package is there) answers None, as it does then
  echo "import sys; sys.modules.update(dict.fromkeys('$HIDE'.split(',')) if '$HIDE' else {})" \
    > "$hidden/sitecustomize.py"
  if [ "$TRIAL" = 1 ]; then  # the project's installed metadata (pip install -e .) read as absent; SITE's is kept
    cat >> "$hidden/sitecustomize.py" <<PY
import importlib.metadata as md
_found = md.MetadataPathFinder.find_distributions
def _not_installed(cls, context=md.DistributionFinder.Context()):
    return (d for d in _found(context) if d.metadata["Name"] != "search-r1-trainer"
            or str(d.locate_file("")).startswith("$SITE"))
md.MetadataPathFinder.find_distributions = classmethod(_not_installed)
PY
  fi
  export PYTHONPATH=$hidden:$PYTHONPATH
  say "hidden: ${HIDE:-none}$([ "$TRIAL" = 1 ] && echo ", and the project's installed metadata")"
fi

"$PYTHON" - <<'PY' 2>&1 | tee -a "$SUMMARY"
import importlib
import importlib.metadata as md
import sys

import torch

line = f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda})"
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    line += f", {p.name} {p.total_memory / 2**30:.0f} GiB"
print(line)
def present(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


versions = []
for name in ("transformers", "pytest", "bm25s", "fastapi", "omegaconf"):
    try:
        versions.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        versions.append(f"{name} MISSING")
print(", ".join(versions) + "; installed: " + ", ".join(f"{m} {'yes' if present(m) else 'no'}"
                                                        for m in ("jax", "vllm", "ray", "faiss")))
PY

# Plugins are loaded by name (-p), not from every package's entry points: the image's own pytest plugins were built
# for its older pytest, and the tier needs only the timeout.
say "pytest tests/gpu -m gpu (at most ${BUDGET}s)"
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout "$BUDGET" "$PYTHON" -m pytest tests/gpu -m gpu -p pytest_timeout \
  -o timeout="${GPU_TESTS_TEST_TIMEOUT:-150}" -q -rfEsp --durations=6 "$@" > "$OUT/pytest.log" 2>&1
status=$?
if grep -q "short test summary info" "$OUT/pytest.log"; then
  sed -n '/slowest .* durations/,$p' "$OUT/pytest.log" | grep -v "^$" | cut -c1-200 | tee -a "$SUMMARY"
else  # stopped before pytest could summarise (the budget): where it was
  say "no pytest summary (exit $status); the end of pytest.log:"
  tail -n 25 "$OUT/pytest.log" | cut -c1-200 | tee -a "$SUMMARY"
fi
say "exit $status$([ "$status" = 124 ] && echo " (stopped at the ${BUDGET}s budget)") after $(( $(date +%s) - START )) s;" \
  "files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$status"
