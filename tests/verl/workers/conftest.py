"""Fixtures of the worker tests (defined in ``worker_test_utils``; nothing autouse, so the rollout
tests below this directory are not affected)."""

from tests.verl.workers.worker_test_utils import qwen_model_dir, tiny_model_dir

__all__ = ["qwen_model_dir", "tiny_model_dir"]
