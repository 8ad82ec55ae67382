"""The bounded off-policy pipeline (``trainer.max_staleness``) through the real entry point (tiny model, HF engines).

Guards against: a row trained on by weights more than ``max_staleness`` updates older than the policy it trains
(checked from the versions every sampled token recorded); a pipeline that does not overlap (staleness always 0,
no overlap time); prompts lost or trained twice when batches generated ahead are in flight at a checkpoint, a
kill -9 and a resume; the pipeline failing on the in-process backend or with partial rollouts off.
"""

from __future__ import annotations

import collections
import json
import signal
import time
from pathlib import Path

import pytest

from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import RAY_WORLD_2, metrics, overrides

pytestmark = pytest.mark.slow  # starts trainers and engines: not in `make test-fast`

ROWS = 16  # the workspace's training rows; 4 per step, so 4 steps per epoch


def trained_rows(directory: Path) -> dict[int, list[dict]]:
    """trainer.rollout_data_dir's records per step."""
    return {int(p.stem): [json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted(directory.glob("*.jsonl"))}


def check_rows(rows: dict[int, list[dict]], steps: int, k: int) -> int:
    """Each epoch trains every row exactly once; every row's oldest token is at most k versions behind the policy
    it trained (version step - 1). Returns the largest staleness seen."""
    assert sorted(rows) == list(range(1, steps + 1))
    per_epoch = ROWS // 4
    for first in range(1, steps + 1, per_epoch):
        epoch = [r["uid"] for s in range(first, min(first + per_epoch, steps + 1)) for r in rows[s]]
        duplicated = [uid for uid, count in collections.Counter(epoch).items() if count > 1]
        assert not duplicated, f"trained twice in the epoch from step {first}: {duplicated}"
        if first + per_epoch - 1 <= steps:
            assert len(epoch) == ROWS, f"rows lost in the epoch from step {first}"
    worst = 0
    for step, records in rows.items():
        for record in records:
            assert record["min_version"] >= 0 and record["max_version"] <= step - 1, (step, record)
            stale = step - 1 - record["min_version"]
            assert stale <= k, (step, record)
            worst = max(worst, stale)
    return worst


def test_pipeline_bound_and_no_prompt_lost_or_repeated_across_a_kill_and_resume(workspace, tmp_path, run_main):
    """Ray world 2, async rollout, max_staleness=1 with partial rollouts: SIGKILL after step 3's checkpoint (batches
    generated ahead are in flight), resume, run to step 6. Every epoch trains each row once, no row is more than one
    version stale, and the pipeline did run ahead (a row one version stale, overlap time logged)."""
    out, dump = tmp_path / "run", tmp_path / "rollouts"
    args = overrides(workspace, out, 6, *RAY_WORLD_2, "trainer.max_staleness=1", "actor_rollout_ref.actor.tis_cap=2",
                     "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.partial=true",
                     f"trainer.rollout_data_dir={dump}")
    proc = run_main(args)
    deadline = time.time() + 600
    while not (out / "global_step_3" / "trainer.pt").exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc = run_main(args)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    assert "resuming from" in log
    assert check_rows(trained_rows(dump), 6, k=1) == 1
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(r["rollout/staleness_max"] <= 1 and r["rollout/dropped_stale"] == 0 for r in records)
    assert any(r["perf/overlap_s"] > 0 for r in records)


def test_pipeline_in_process_waits_for_in_flight_rows_at_a_sync(workspace, tmp_path):
    """The in-process backend, max_staleness=2, partial rollouts off (a sync waits for the batch being generated):
    the bound holds and every row of a batch was sampled by one version (no row continued on new weights)."""
    out, dump = tmp_path / "run", tmp_path / "rollouts"
    done = main_ppo_in_process(*overrides(workspace, out, 5, "trainer.max_staleness=2",  # in this process
                                          "actor_rollout_ref.actor.tis_cap=2", f"trainer.rollout_data_dir={dump}"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = trained_rows(dump)
    assert check_rows(rows, 5, k=2) >= 1
    assert all(r["min_version"] == r["max_version"] for records in rows.values() for r in records)
    assert all(r["rollout/staleness_max"] <= 2 for r in metrics(out))


def test_pipeline_needs_importance_correction():
    from verl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.tis_cap.*max_staleness=1"):
        load_config(["trainer.max_staleness=1"])
    with pytest.raises(ConfigError, match="rollout.partial"):
        load_config(["actor_rollout_ref.rollout.partial=true"])


def test_disaggregated_rollout_ranks_get_every_update_directly(workspace, tmp_path, ray_address):
    """trainer.rollout_ranks=1 of 2 Ray ranks: one rank trains, one only generates. With the pipeline off, the
    engine's log-probs of what it sampled must equal the trainer's at every step (a missed or partial weight sync
    shows as a mismatch from step 2 on, since lr=1e-3 moves the policy each step), the weights reach the engine
    (bytes counted on the rollout rank) and almost nothing of them passes through the driver."""
    out = tmp_path / "run"
    done = main_ppo_in_process(*overrides(workspace, out, 3, *RAY_WORLD_2, "trainer.rollout_ranks=1",
                                          "actor_rollout_ref.rollout.mode=async"), ray_address=ray_address)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 rank(s) + 1 rollout rank(s)" in done.stdout
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["rollout/logprob_diff_max"] < 1e-4, r
        assert r["perf/sync_bytes_engine"] > 100_000 and r["perf/sync_bytes_driver"] < 1_000
        assert r["perf/rollout_ranks"] == 1
