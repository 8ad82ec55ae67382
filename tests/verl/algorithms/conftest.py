"""Fixtures of the algorithm tests: the tiny model of the worker tests (the policy-loss tests drive the actor) and
the trainer tests' workspace (the registry tests train a step with a registered estimator)."""

from tests.verl.trainer.trainer_test_utils import run_main, workspace  # noqa: F401
from tests.verl.workers.worker_test_utils import tiny_model_dir  # noqa: F401
