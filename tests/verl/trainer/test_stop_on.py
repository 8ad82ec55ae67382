"""``trainer.stop_on``: an alarm it names stops a real run (the tests' tiny workspace) after the step it fired on is
logged and saved, and the same command resumes from that checkpoint.

Guards against a stop that loses the step (no checkpoint of it, or its metrics never logged) and a resume that
repeats the warning or the stop: before, an alarm could only warn.
"""

from __future__ import annotations

import json

import pytest

from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import metrics, overrides
from verl.utils import checkpoint

pytestmark = pytest.mark.slow


def test_an_alarm_in_stop_on_stops_after_saving_and_the_run_resumes(workspace, tmp_path):
    """The workspace's tiny policy runs into the 24-token budget on most rows (train/overlong_frac > 0.2 from step 1),
    so stop_on=[length_budget] stops the 3-step run at step 1 (exit 3) with step 1 logged, its trajectories kept and
    its checkpoint saved although save_freq never saves; the same command without the name in stop_on (a steering
    key) continues at step 2 without repeating the warning and finishes."""
    out = tmp_path / "run"
    args = overrides(workspace, out, 3, "trainer.save_freq=-1", "trainer.alarm_overlong_above=0.2")
    done = main_ppo_in_process(*args, "trainer.stop_on=[length_budget]")
    log = done.stdout + done.stderr
    assert done.returncode == 3, log[-3000:]
    assert "stopped at step 1: the health alarm length_budget fired (example trajectory row" in log
    assert f"saved checkpoint {out / 'global_step_1'}; run the same command to continue at step 2" in log
    assert log.count("HEALTH ALARM length_budget at step 1") == 1
    assert checkpoint.find_latest(out) == out / "global_step_1" and not (out / "hf_model").exists()
    logged = metrics(out)
    assert [r["step"] for r in logged] == [1] and logged[0]["health/length_budget"] == 1
    assert logged[0]["train/overlong_frac"] > 0.2
    example = log.split("length_budget fired (example trajectory ", 1)[1].split(")", 1)[0]
    kept = [json.loads(line)["uid"] for line in (out / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert example in kept  # the example can be opened in search-r1-inspect

    resumed = main_ppo_in_process(*args, "trainer.stop_on=[]")
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-3000:]
    assert f"resuming from {out / 'global_step_1'}" in log
    assert "HEALTH ALARM length_budget" not in log  # warned before the stop already
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]


def test_a_stop_on_name_that_is_no_alarm_is_refused_before_anything_is_written(workspace, tmp_path):
    """Guards against a typo in trainer.stop_on found only when the alarm would fire (or never): exit 2 at start,
    naming the key and the alarms, and no run directory."""
    out = tmp_path / "run"
    done = main_ppo_in_process(*overrides(workspace, out, 1, "trainer.stop_on=[entropy]"))
    log = done.stdout + done.stderr
    assert done.returncode == 2, log[-3000:]
    assert "trainer.stop_on=['entropy'] is invalid: 'entropy' is no alarm; allowed: entropy_collapse" in log
    assert "hedged_answers" in log and not out.exists()

