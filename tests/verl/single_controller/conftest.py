"""Fixtures of the worker-group tests: those of the worker tests and of the rollout-engine tests, whose
helpers live in ``tests/verl/workers`` and ``tests/verl/workers/rollout``."""

from tests.verl.workers.rollout.rollout_helpers import model_dir, prompts, tokenizer
from tests.verl.workers.worker_test_utils import tiny_model_dir

__all__ = ["model_dir", "prompts", "tiny_model_dir", "tokenizer"]
