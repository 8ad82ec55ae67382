# Sourced by the scripts that run this project on the GPU machine, which has no package registry
# (benchmarks/gpu_tests.sh, gpu_step_check.sh, gpu_demo_real.sh). `carried_site SITE` installs the wheels carried in
# .whl/ (`make gpu-wheels` downloads them here: benchmarks/gpu_step_check.py, CARRIED) into SITE, those of
# .whl/if_older/ only where the machine's own copy is older, writes the project's metadata (project_metadata) and
# the dense encoder's stub where its package is missing, and puts SITE and the repository first on PYTHONPATH.
# Uses PYTHON; prints what it did.
carried_site() {
  local site=$1
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .whl/*.whl 2>&1 | tail -3
    if [ -d .whl/if_older ]; then "$PYTHON" benchmarks/gpu_step_check.py if-older .whl/if_older "$site"; fi
  else
    echo "no .whl/ here: using the interpreter's own packages (\`make gpu-wheels\` downloads what the GPU machine lacks)"
  fi
  project_metadata "$site"
  export PYTHONPATH=$site:$PWD
  "$PYTHON" benchmarks/gpu_step_check.py stub-encoder "$site"
}

# `project_metadata SITE`: this checkout's package metadata (search_r1_trainer.egg-info: its entry points, among them
# the recipe it registers in the group verl.recipes, the default of the trainer's key `recipe`) written into SITE, as
# `pip install -e .` leaves it. The checkout travels without its git-ignored egg-info and is imported through
# PYTHONPATH, not installed, so without this every run there stops at "config key recipe is not set".
project_metadata() {
  local site=$1
  mkdir -p "$site"
  "$PYTHON" setup.py -q egg_info --egg-base "$site" 2>&1 | grep -v -i "warning\|deprecat" | tail -3
  ls -d "$site"/*.egg-info 2>/dev/null || echo "no project metadata in $site: \`setup.py egg_info\` failed"
}
