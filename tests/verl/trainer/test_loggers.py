"""Trackers (``trainer.logger``, verl/utils/tracking.py): every combination ends a finished run cleanly, and a
logger that cannot start is an exit-2 message before any model loads.

Guards against issue 37: with Search-R1's ``trainer.logger=['wandb']`` or with ``['console']`` a run trained, saved
its checkpoint, then died with a FileNotFoundError for metrics.jsonl (exit 1); a missing or unconfigured W&B was a
traceback after start-up.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import ROOT, overrides
from verl.config import LOGGERS
from verl.utils.plots import plot_curves
from verl.utils.tracking import Tracker, read_metrics

COMBINATIONS = [list(c) for n in range(1, len(LOGGERS) + 1) for c in itertools.combinations(LOGGERS, n)]


def offline_env(home: Path) -> dict[str, str]:
    """No W&B key anywhere (HOME without a .netrc), W&B offline: no network is needed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return {**env, "HOME": str(home), "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("loggers", [pytest.param(c, id="+".join(c), marks=[pytest.mark.slow] if "wandb" in c else [])
                                     for c in COMBINATIONS])  # slow: W&B starts its service process
def test_every_logger_combination_logs_and_closes(loggers, tmp_path, monkeypatch):
    """The end of a run (log the steps, close, draw the curves from metrics.jsonl) works for every combination:
    metrics.jsonl is the run's record whatever trainer.logger says."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    tracker = Tracker(loggers, tmp_path / "run", "proj", "exp", {"a": 1})
    for step in (1, 2):
        tracker.log({"critic/score/mean": 0.1 * step, "val/em": 0.5}, step=step)
    tracker.close()
    plot_curves(tracker.jsonl_path, tmp_path / "run" / "curves.png", "exp")
    assert [r["step"] for r in read_metrics(tracker.jsonl_path)] == [1, 2]
    assert (tmp_path / "run" / "curves.png").is_file()
    if "wandb" in loggers:
        assert list((tmp_path / "run" / "wandb").glob("offline-run-*")), "W&B offline wrote its run locally"
    if "tensorboard" in loggers:
        assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.slow
@pytest.mark.parametrize("loggers", [["wandb"], ["console"], ["console", "jsonl", "tensorboard", "wandb"]])
def test_a_finished_run_exits_0_with_search_r1s_loggers(workspace, tmp_path, loggers):
    """main_ppo with Search-R1's trainer.logger=['wandb'] (offline, no network, no key) or console only: both steps
    train, the checkpoint is saved and the run exits 0 (the trainer's main in this process, tests/entry_points.py)."""
    out = tmp_path / "run"
    env = {**dict.fromkeys([k for k in os.environ if k.startswith("WANDB_")]), **offline_env(tmp_path)}
    env.pop("PYTHONPATH")
    done = main_ppo_in_process(*overrides(workspace, out, 2, f"trainer.logger={loggers}"), env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "actor/pg_loss" in r] == [1, 2]
    assert (out / "global_step_2").is_dir() and (out / "curves.png").is_file()


@pytest.mark.slow  # a trainer subprocess
def test_missing_wandb_or_key_is_exit_2_before_the_model_loads(workspace, tmp_path, monkeypatch):
    """wandb not installed (a shadowing package that fails to import, as a missing one does: a fresh interpreter
    whose path finds it first), or installed with no API key and not offline (the trainer's main in this process,
    tests/entry_points.py): exit 2 with the fix named, before anything of the run exists (no run directory)."""
    shadow = tmp_path / "shadow" / "wandb"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'wandb'\")\n")
    missing = {**offline_env(tmp_path), "PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo",
                           *overrides(workspace, out, 1, "trainer.logger=['wandb']")],
                          cwd=ROOT, env=missing, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "wandb is not installed: pip install wandb" in done.stderr, \
        done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not out.exists()

    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    done = main_ppo_in_process(*overrides(workspace, out, 1, "trainer.logger=['wandb']"))
    assert done.returncode == 2 and "W&B has no API key: set WANDB_API_KEY" in done.stderr, \
        done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not out.exists()


@pytest.mark.slow  # trains
@pytest.mark.parametrize("kl_keys, logged", [
    (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true"],
     "actor/kl_loss"),
    (["algorithm.use_kl_in_reward=true"], "actor/reward_kl_penalty"),
], ids=["kl_loss", "kl_in_reward"])
def test_the_console_kl_column_is_the_kl_the_loss_uses(workspace, tmp_path, kl_keys, logged):
    """Guards against issue 57's item 3: the console's ``kl`` showed actor/ppo_kl (the KL to the sampling policy,
    0 on an on-policy update) while the loss used actor/kl_loss (1e-4 to 3e-4 in the user's run). Each step's
    ``kl`` on the console is the logged KL of the loss: the actor's KL loss, or the in-reward penalty's KL."""
    out = tmp_path / "run"
    done = main_ppo_in_process(*overrides(workspace, out, 2, *kl_keys, "trainer.logger=[console,jsonl]"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shown = {int(step): float(kl) for step, kl in re.findall(r"^step (\d+) .*?\bkl (\S+)", done.stderr, re.M)}
    records = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}
    assert sorted(shown) == [1, 2]
    for step, kl in shown.items():
        assert kl == float(f"{records[step][logged]:.4g}"), (step, kl, records[step])
    assert any(records[step][logged] != records[step]["actor/ppo_kl"] for step in shown)  # the two differ here
