"""Fixtures of the algorithm tests: the tiny model of the worker tests (the policy-loss tests drive the actor)."""

from tests.verl.workers.worker_test_utils import tiny_model_dir  # noqa: F401
