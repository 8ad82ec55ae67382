"""Reruns and the command line of the trainer (issue 37's smaller items): a rerun of a finished run says it is
complete, a resumed run's summary shows the run's own "before" (not nan), validation-only says so, --help works."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.verl.trainer.trainer_test_utils import ROOT, copy_run, trained_run_args


def main_ppo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_help_is_usage_not_an_unknown_option():
    done = main_ppo("--help")
    assert done.returncode == 0 and "usage: python -m verl.trainer.main_ppo" in done.stdout
    assert "retriever.url" in done.stdout and "unknown option" not in done.stderr


@pytest.mark.parametrize("module", ["retrieval_server.serve", "retrieval_server.build_index",
                                    "retrieval_server.import_index", "data_prep.qa_search", "search_r1.evaluate",
                                    "search_r1.infer"])
def test_every_entry_point_has_help(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


@pytest.mark.slow
def test_resume_summary_and_a_finished_run(workspace, trained_run, tmp_path):
    """The first run is a copy of the shared trained run's directory as it stood after step 1 (its validation
    before step 1 logged at step 0)."""
    out = copy_run(trained_run, tmp_path / "run", 1)
    resumed = main_ppo(*trained_run_args(workspace, out, 2))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "nan" not in resumed.stdout and "val/em: before " in resumed.stdout, resumed.stdout
    again = main_ppo(*trained_run_args(workspace, out, 2))
    assert again.returncode == 0 and "run already complete: 2 of 2 steps" in again.stdout, again.stdout[-2000:]
    val_only = main_ppo(*trained_run_args(workspace, out, 2, "+trainer.val_only=true"))
    assert val_only.returncode == 0 and "validation only" in val_only.stdout and " steps ->" not in val_only.stdout


@pytest.mark.parametrize("script", ["train_ppo.sh", "train_grpo.sh", "retrieval_launch.sh"])
def test_launchers_have_help_and_prepare_nothing(script):
    """`bash train_ppo.sh --help` went to the demo path (it names no data), preparing the demo before any help."""
    demo_before = (ROOT / "data" / "demo").exists()
    done = subprocess.run(["bash", str(ROOT / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and ("usage: bash" in done.stdout or "retrieval service" in done.stdout), done.stderr
    assert (ROOT / "data" / "demo").exists() == demo_before
