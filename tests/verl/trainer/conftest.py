"""Fixtures of the trainer tests (defined in ``trainer_test_utils``, and the tiny model of the worker tests; the
trainer workspace and the shared trained runs are fixtures of ``tests/conftest.py``)."""

from tests.verl.trainer.trainer_test_utils import run_main  # noqa: F401
from tests.verl.workers.worker_test_utils import tiny_model_dir  # noqa: F401
