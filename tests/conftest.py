"""Fixtures shared by all test directories: the real-vocabulary (Qwen2.5) tokenizer; the trainer tests' tiny
workspace and the trained runs that the resume tests continue copies of (``tests/verl/trainer/trainer_test_utils``,
built once per test run).

``qwen_tokenizer`` is built from the BPE ranks the ``dashscope`` package ships
(``data_prep.qwen_tokenizer``); the first build of a machine takes a few seconds, later ones read the
cached ``tokenizer.json``. Tests that must hold for any real vocabulary parametrize their tokenizer
fixture over the project's tiny tokenizer and this one.
"""

from __future__ import annotations

import pytest

from data_prep.qwen_tokenizer import build_qwen_tokenizer
from tests.verl.trainer.trainer_test_utils import trained_run, trained_run_ray, workspace  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen2.5's tokenizer: 151,665 ids, byte-level BPE, search tags are several tokens."""
    return build_qwen_tokenizer()


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's ``--dist loadgroup`` (``make test``): a test without an ``xdist_group`` mark is grouped
    with the other tests of its module, so a module's fixtures (a server, an engine, a Ray instance) are built once,
    on one worker, as in a serial run. Tests that share something more expensive across modules carry an
    ``xdist_group`` mark of their own."""
    if not getattr(config.option, "loadgroup", False):  # xdist sets it on its workers (where dist reads "no")
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
