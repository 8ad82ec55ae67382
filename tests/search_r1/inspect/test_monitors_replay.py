"""``search-r1-inspect --monitors RUN_DIR``: the health alarms replayed over a run directory.

Guards against a replay that disagrees with the run it replays (the acceptance reads the demo, demo-real and
collapse runs' alarms from their directories): on the shared 4-step run made with these alarms, the replay's firings
are the ones the run logged (health/<name>), also when the monitor/* values are gone from metrics.jsonl (a run made
before the alarms: they are measured again on the kept trajectories); key=value arguments change the thresholds;
a directory that is no run is exit 2 naming it.
"""

from __future__ import annotations

import json
import shutil

import pytest

from search_r1.inspect.cli import main
from search_r1.inspect.monitors import replay
from tests.verl.trainer.trainer_test_utils import metrics


def logged_firings(run_dir) -> dict[str, list[int]]:
    """alarm -> the steps the run logged health/<alarm> = 1 on."""
    fired: dict[str, list[int]] = {}
    for record in metrics(run_dir):
        for key, value in record.items():
            if key.startswith("health/") and value:
                fired.setdefault(key.removeprefix("health/"), []).append(record["step"])
    return fired


def replayed_firings(result) -> dict[str, list[int]]:
    return {a.name: a.fired for a in result.alarms if a.fired}


@pytest.mark.slow  # the shared trained run (trainer_test_utils.trained_run), built once per test run
def test_the_replay_fires_where_the_run_did_and_prints_it(trained_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    live = logged_firings(run_dir)
    assert live  # the tiny policy runs into the budget: something fired
    result = replay(run_dir)
    assert replayed_firings(result) == live
    assert result.steps == 4 and result.steps_with_rows == 4

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if not k.startswith(("monitor/", "health/"))}) + "\n" for r in lines))
    assert replayed_firings(replay(run_dir)) == live  # measured again from rollouts/ (the whole 4-row batches)

    quiet = replay(run_dir, ["trainer.alarm_overlong_above=1.0"])
    assert "length_budget" not in replayed_firings(quiet)

    assert main(["--monitors", str(run_dir), "trainer.alarm_window=2"]) == 0  # a score trend over 4 steps
    out = capsys.readouterr().out
    assert "health alarms over" in out and f"HEALTH ALARM {next(iter(live))} at step" in out
    assert "score (critic/score/mean, windowed mean): peak" in out


def test_a_directory_that_is_no_run_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["--monitors", str(tmp_path / "empty")]) == 2
    assert "no config.yaml; --monitors replays a run directory" in capsys.readouterr().err
    try:
        main(["--monitors", str(tmp_path / "empty"), str(tmp_path)])
    except SystemExit as stop:
        assert stop.code == 2
    assert "--monitors takes one run directory, then only key=value settings" in capsys.readouterr().err
