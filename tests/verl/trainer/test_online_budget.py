"""The trainer against an online search backend whose request budget runs out: the run ends with exit 3, a
checkpoint of its last finished step and a message naming the budget, at once (not after the outage wait).

Guards against a spent budget that a run cannot tell from an outage (it would wait ``retriever.outage_timeout_s``,
here 300 s, retrying a service that will never answer) or that ends it without a checkpoint. The service is the
real ``serve --backend serper`` against the loopback engines (``tests/retrieval_server/loopback_engines.py``), the
policy the stability tests' searching model, which sends the same query every turn.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from retrieval_server.launcher import ServerProcess, free_port
from tests.entry_points import main_ppo_in_process
from tests.retrieval_server.loopback_engines import LoopbackEngines
from tests.verl.trainer.test_stability import search_setup  # noqa: F401, F811  (a fixture)
from tests.verl.trainer.trainer_test_utils import overrides
from verl.utils import checkpoint

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

KEY, KEY_ENV = "sk-budget-test-41", "SEARCH_R1_TEST_BUDGET_KEY"


def online_service(engines: LoopbackEngines, port: int, cache: Path, budget: int) -> ServerProcess:
    command = [sys.executable, "-m", "retrieval_server.serve", "--backend", "serper", "--api-key-env", KEY_ENV,
               "--search-url", engines.url("serper"), "--cache-dir", str(cache), "--port", str(port),
               "--max-requests", str(budget), "--backoff", "0.01", "--max-retries", "4"]
    server = ServerProcess(command=command, port=port, env={**os.environ, KEY_ENV: KEY})
    server.wait_ready(60)  # stops the server itself if it never becomes ready
    return server


def run_args(ws: Path, setup: dict, out: Path, port: int, steps: int) -> list[str]:
    return overrides(ws, out, steps, f"actor_rollout_ref.model.path={setup['model']}",
                     f"data.train_files={setup['train']}", "do_search=true", f"retriever.url=http://127.0.0.1:{port}",
                     "retriever.outage_timeout_s=300", "max_turns=2", "data.max_trajectory_length=48",
                     "retriever.topk=1")


def test_a_spent_budget_ends_the_run_with_a_checkpoint_and_a_message_naming_it(workspace, search_setup,  # noqa: F811
                                                                               tmp_path):
    """Step 1 searches through the backend (one engine request: every row asks the same query). Then the service
    is restarted over an empty cache with a budget of 2 while the engine answers every request 429: the resumed
    run's step 2 burns the budget in retries and stops (exit 3) naming --max-requests 2 and global_step_1, and it
    stops at once: its client does not wait out retriever.outage_timeout_s=300."""
    port, out = free_port(), tmp_path / "run"
    engines = LoopbackEngines(KEY, index=search_setup["index"], corpus=search_setup["corpus"]).start()
    try:
        with online_service(engines, port, tmp_path / "cache", budget=10):
            first = main_ppo_in_process(*run_args(workspace, search_setup, out, port, steps=1))
        assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
        assert engines.count("serper") >= 1, "the policy must search through the backend for the test to mean anything"
        engines.fail_all = 429
        with online_service(engines, port, tmp_path / "empty_cache", budget=2) as server:
            second = main_ppo_in_process(*run_args(workspace, search_setup, out, port, steps=3))
            log = second.stdout + second.stderr
            health = httpx.get(server.url + "/health").json()
        assert (health["requests"], health["requests_left"], health["retries"]) == (2, 0, 1)
    finally:
        engines.stop()
    assert second.returncode == 3, log[-3000:]
    assert "says waiting will not help" in log and "budget exhausted: 2 of --max-requests 2 requests" in log
    assert f"stopped after step 1 (saved checkpoint {out / 'global_step_1'})" in log
    assert "failed for" not in log  # no outage wait
    assert checkpoint.complete_steps(out) == [1]
