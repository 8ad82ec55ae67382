"""Fixtures of the trainer tests (defined in ``trainer_test_utils``)."""

from tests.verl.trainer.trainer_test_utils import run_main, workspace  # noqa: F401
