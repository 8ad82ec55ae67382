"""Fixtures shared by all test directories: the real-vocabulary (Qwen2.5) tokenizer; the trainer tests' tiny
workspace and the trained runs that the resume tests continue copies of (``tests/verl/trainer/trainer_test_utils``,
built once per test run).

``qwen_tokenizer`` is built from the BPE ranks the ``dashscope`` package ships
(``data_prep.qwen_tokenizer``); the first build of a machine takes a few seconds, later ones read the
cached ``tokenizer.json``. Tests that must hold for any real vocabulary parametrize their tokenizer
fixture over the project's tiny tokenizer and this one.
"""

from __future__ import annotations

import os

import pytest
import torch

from data_prep.qwen_tokenizer import build_qwen_tokenizer
from tests.ray_cluster import start_cluster
from tests.retrieval_servers import corpus_path, flat_index, flat_server, shard_builds, shard_sets  # noqa: F401
from tests.verl.trainer.trainer_test_utils import trained_run, trained_run_ray, workspace  # noqa: F401 (fixtures)

# `make test-gpu` (tests/gpu): the tests marked `gpu` run on CUDA and are skipped, not failed, where no CUDA device
# exists. GPU_TESTS_DEVICE=cpu runs them on the CPU instead, as a trial of the tier itself on a machine without a GPU
# (benchmarks/gpu_tests.sh's CPU mode); their comparisons with the CPU then compare the CPU with itself.
GPU_TESTS_ON_CPU = os.environ.get("GPU_TESTS_DEVICE") == "cpu"


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") and not (torch.cuda.is_available() or GPU_TESTS_ON_CPU):
        pytest.skip("needs a CUDA GPU (GPU_TESTS_DEVICE=cpu: run the gpu tier on the CPU as a trial)")


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen2.5's tokenizer: 151,665 ids, byte-level BPE, search tags are several tokens."""
    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for the module that asks (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``),
    its module fixtures included (a policy memorised, a tiny model trained). Tiny models gain nothing from threads,
    and on a shared 2-core machine OpenMP threads spinning against other processes made a tiny model's update ~100x
    slower and a 151k-row LM head's memorising ~3x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)




@pytest.fixture(scope="session")
def ray_address():
    """The address of a Ray instance started once per test run (this process owns it) for every test that needs
    one: trainers with trainer.backend=ray join it through RAY_ADDRESS (``run_main`` passes it on), in-process
    drivers with ``ray.init(address=...)`` and ``ray.shutdown()`` (which only disconnects). Starting Ray took
    ~5 s per run or module (tests/ray_cluster.py)."""
    cluster = start_cluster()
    yield cluster.address
    cluster.shutdown()


# --- make test: pytest-xdist workers (`-n 2 --dist loadscope`) -----------------------------------------------------
# A test's scope is the unit a worker takes: by default its module (module fixtures, a server or an engine, are built
# once, as in a serial run); the tests that share the session's Ray instance (``ray_address``) form one scope, so it
# is started once per run. pytest-xdist's own ``xdist_group`` marks are not used: with pytest 9 its loadgroup
# scheduler no longer sees them (it rewrites ``item._nodeid``, which pytest 9 does not read).
SHARED_SCOPES = {
    "tests/verl/trainer/test_ppo_trainer.py::test_kill_and_resume_matches_uninterrupted_run[ray-world-2]": "ray",
    "tests/verl/trainer/test_ppo_trainer.py::test_two_ranks_train_like_one": "ray",
    "tests/verl/trainer/test_pipeline.py::test_pipeline_bound_and_no_prompt_lost_or_repeated_across": "ray",
    "tests/verl/trainer/test_pipeline.py::test_disaggregated_rollout_ranks_get_every_update_directly": "ray",
    "tests/verl/trainer/test_dynamic_sampling.py::test_grpo_with_dynamic_sampling_on_two_ranks": "ray",
    "tests/verl/trainer/test_learning_signals.py": "ray",
    "tests/search_r1/llm_agent/test_agent_hf.py::test_search_loop_through_a_two_rank_group": "ray",
    "tests/verl/single_controller/test_group_rollout.py": "ray",
    "tests/verl/single_controller/test_worker_groups.py": "ray",
    # the session's shard servers (tests/retrieval_servers.py: shard_sets, flat_server), started once per run
    "tests/retrieval_server/test_shards.py": "shard servers",
    "tests/test_user_errors_surfaces.py": "shard servers",
}
# Scopes that take longest (measured), handed out first in this order so that the workers finish together; the
# others follow in collection order.
LONGEST_FIRST = [
    "ray", "tests/verl/trainer/test_stability.py", "tests/retrieval_server/test_ray_service.py",
    "shard servers", "tests/scripts/test_launchers.py", "tests/test_user_errors.py",
    "tests/search_r1/llm_agent/test_agent_hf.py", "tests/verl/trainer/test_loggers.py",
    "tests/verl/trainer/test_ppo_trainer.py", "tests/data_prep/test_demo_numerics.py",
    "tests/search_r1/test_search_r1_overrides_train.py", "tests/test_wheel.py",
    "tests/verl/workers/test_fsdp.py", "tests/verl/trainer/test_rerun.py",
]


def xdist_scope(nodeid: str) -> str:
    """The scope of a test (SHARED_SCOPES, else its module)."""
    for prefix, scope in SHARED_SCOPES.items():
        if nodeid.startswith(prefix):
            return scope
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    """On an xdist worker: the tests of LONGEST_FIRST's scopes first (every worker collects the same order, which
    the controller's queue of scopes follows)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {scope: i for i, scope in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_scope(item.nodeid), len(rank)))  # stable: the rest keep their order


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist is in the dev extra; without it, `make test-fast` and single files still run
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:
    class ScopeScheduling(LoadScopeScheduling):
        """``--dist loadscope`` with this suite's scopes (``xdist_scope``), handed out in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") == "loadscope":
            config.option.loadscopereorder = False  # keep LONGEST_FIRST's order, not the largest test count first
            return ScopeScheduling(config, log)
        return None
