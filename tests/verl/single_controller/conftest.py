"""Fixtures of the worker-group tests: those of the worker tests and of the rollout-engine tests, whose
helpers live in ``tests/verl/workers`` and ``tests/verl/workers/rollout``."""

import sys
from pathlib import Path

WORKERS = Path(__file__).resolve().parents[1] / "workers"
sys.path.insert(0, str(WORKERS))
sys.path.insert(0, str(WORKERS / "rollout"))

from rollout_helpers import model_dir, prompts, tokenizer  # noqa: E402
from worker_test_utils import one_torch_thread, tiny_model_dir  # noqa: E402

__all__ = ["model_dir", "one_torch_thread", "prompts", "tiny_model_dir", "tokenizer"]
