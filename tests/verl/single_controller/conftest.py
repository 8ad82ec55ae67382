"""Fixtures of the worker-group tests: those of the worker tests, whose helpers live in ``tests/verl/workers``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))

from worker_test_utils import one_torch_thread, tiny_model_dir  # noqa: E402

__all__ = ["one_torch_thread", "tiny_model_dir"]
