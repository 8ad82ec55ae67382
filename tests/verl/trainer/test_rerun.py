"""Reruns and the command line of the trainer (issue 37's smaller items): a rerun of a finished run says it is
complete, a resumed run's summary shows the run's own "before" (not nan), validation-only says so, --help works."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import ROOT, TRAINED_STEPS, copy_run, final_weights, trained_run_args


def main_ppo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


ENTRY_POINTS = ["verl.trainer.main_ppo", "retrieval_server.serve", "retrieval_server.build_index",
                "retrieval_server.import_index", "data_prep.qa_search", "search_r1.evaluate", "search_r1.infer",
                "data_prep.import_model"]

# `python -m MODULE --help` for each module, in one interpreter: runpy.run_module(run_name="__main__") is what -m
# runs; the exit status is the SystemExit's code (0 when the module ends without one, as `python -m` exits).
HELP_RUNNER = """
import contextlib, io, json, runpy, sys, traceback
results = {}
for module in sys.argv[1:]:
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [module, "--help"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    results[module] = {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    """module -> what `python -m MODULE --help` printed and its exit status (one subprocess for all: each
    interpreter start imports torch and transformers, most of what a --help costs)."""
    done = subprocess.run([sys.executable, "-c", HELP_RUNNER, *ENTRY_POINTS], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow  # a subprocess
def test_help_is_usage_not_an_unknown_option(helps):
    done = helps["verl.trainer.main_ppo"]
    assert done["returncode"] == 0 and "usage: python -m verl.trainer.main_ppo" in done["stdout"]
    assert "retriever.url" in done["stdout"] and "unknown option" not in done["stderr"]


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("module", ENTRY_POINTS[1:])
def test_every_entry_point_has_help(helps, module):
    done = helps[module]
    assert done["returncode"] == 0 and "usage:" in done["stdout"], done["stderr"][-2000:]


@pytest.mark.slow
def test_resume_summary_and_a_finished_run(workspace, trained_run, tmp_path):
    """The first run is a copy of the shared trained run's directory as it stood after step 1 (its validation
    before step 1 logged at step 0); the rerun of the finished run and the validation run the trainer's main in
    this process (tests/entry_points.py)."""
    out = copy_run(trained_run, tmp_path / "run", 1)
    resumed = main_ppo(*trained_run_args(workspace, out, 2))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "nan" not in resumed.stdout and "val/em: before " in resumed.stdout, resumed.stdout
    again = main_ppo_in_process(*trained_run_args(workspace, out, 2))
    assert again.returncode == 0 and "run already complete: 2 of 2 steps" in again.stdout, again.stdout[-2000:]
    val_only = main_ppo_in_process(*trained_run_args(workspace, out, 2, "+trainer.val_only=true"))
    assert val_only.returncode == 0 and "validation only" in val_only.stdout and " steps ->" not in val_only.stdout


@pytest.mark.slow  # a subprocess per launcher
@pytest.mark.parametrize("script", ["train_ppo.sh", "train_grpo.sh", "retrieval_launch.sh"])
def test_launchers_have_help_and_prepare_nothing(script):
    """`bash train_ppo.sh --help` went to the demo path (it names no data), preparing the demo before any help."""
    demo_before = (ROOT / "data" / "demo").exists()
    done = subprocess.run(["bash", str(ROOT / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and ("usage: bash" in done.stdout or "retrieval service" in done.stdout), done.stderr
    assert (ROOT / "data" / "demo").exists() == demo_before


def test_a_run_killed_after_its_last_checkpoint_writes_its_model_on_rerun(workspace, trained_run, tmp_path):
    """Guards the end of a run: killed after its last checkpoint and before (or while) the Hugging Face model
    directory was written, the rerun found every step done, exited 0 and never wrote the model (seen in
    test_kill_9_at_random_moments_resumes_at_the_right_step). The rerun now writes the model (and the curves) from
    the last checkpoint, the trained run's final weights; a half-written export is never taken for a model."""
    out = copy_run(trained_run, tmp_path / "run", TRAINED_STEPS)  # the checkpoints of every step, no hf_model
    (out / "hf_model.tmp").mkdir()  # what a kill during the export leaves
    (out / "hf_model.tmp" / "config.json").write_text("{")
    again = main_ppo_in_process(*trained_run_args(workspace, out, TRAINED_STEPS))
    assert again.returncode == 0 and "run already complete" in again.stdout, again.stdout[-2000:]
    assert (out / "hf_model" / "config.json").exists() and (out / "curves.png").exists()
    assert not (out / "hf_model.tmp").exists()
    mine, theirs = final_weights(workspace, out), final_weights(workspace, trained_run)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
