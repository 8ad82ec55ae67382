"""Shared by the trainer tests: a tiny workspace (model, parquet, toy reward), overrides, run helpers, and the
trained runs the resume tests start from.

The fixtures are defined here and imported by ``tests/verl/trainer/conftest.py`` (and by the other test modules
that train on the workspace). The workspace and the trained runs are built once per test run (``built_once``),
whichever pytest-xdist worker asks first; nothing writes into them: a test that continues a trained run continues a
copy (``copy_run``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import save_tiny_model
from search_r1.prompts import make_prompt
from tests.shared_builds import built_once
from verl.config import DEMO_CONFIG

ROOT = Path(__file__).resolve().parents[3]

REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A dense toy reward so updates are non-trivial: share of letters 'e' in the response."""
    return solution_str.count("e") / max(len(solution_str), 1)
'''


def build_workspace(root: Path) -> Path:
    """The tiny policy (``model``), 16 training rows, 4 validation rows and the toy reward, in ``root``."""
    questions = [f"Who founded the guild number {i} of Vuzaholm" for i in range(16)]
    texts = [make_prompt(q) for q in questions]
    texts += ["the answer is <answer> here </answer> and <search> q </search>"] * 20
    save_tiny_model(root / "model", texts, vocab_size=600)
    rows = [make_row("toy", q, [f"name {i}"], "train", i) for i, q in enumerate(questions)]
    rows_to_parquet(rows, root / "train.parquet")
    rows_to_parquet(rows[:4], root / "test.parquet")
    (root / "reward.py").write_text(REWARD_FN)
    return root


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "trainer_workspace", build_workspace)


RAY_WORLD_2 = ["trainer.backend=ray", "trainer.n_gpus_per_node=2"]


def overrides(ws: Path, out: Path, steps: int, *extra: str) -> list[str]:
    """Arguments of a short run on the workspace: the demo's config layer (its small budgets), then these keys."""
    return [
        "--config", str(DEMO_CONFIG),
        f"data.train_files={ws / 'train.parquet'}", f"data.val_files={ws / 'test.parquet'}",
        f"actor_rollout_ref.model.path={ws / 'model'}", "actor_rollout_ref.rollout.name=hf",
        "data.train_batch_size=4", "data.max_trajectory_length=24", "data.max_obs_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "do_search=false", f"custom_reward_function.path={ws / 'reward.py'}",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}", *extra,
    ]


def main_env(args: list[str], ray_address: str | None) -> dict[str, str]:
    """The environment of a trainer subprocess: this one's, the tree under test first on the path, and with
    trainer.backend=ray the session's Ray instance (unless RAY_ADDRESS already names one)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if "trainer.backend=ray" in args and ray_address and "RAY_ADDRESS" not in env:
        env["RAY_ADDRESS"] = ray_address
    return env


@pytest.fixture
def run_main(request):
    """``run_main(args)`` starts ``python -m verl.trainer.main_ppo args`` in its own session (a run with
    trainer.backend=ray joins the session's Ray instance, ``ray_address``); at teardown whatever is left of every
    session started is killed."""
    sessions: list[subprocess.Popen] = []

    def start(args: list[str]) -> subprocess.Popen:
        ray_address = request.getfixturevalue("ray_address") if "trainer.backend=ray" in args else None
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=ROOT,
                                env=main_env(args, ray_address), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        sessions.append(proc)
        return proc

    yield start
    for proc in sessions:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


TRAINED_STEPS = 4


def trained_run_args(ws: Path, out: Path, steps: int, *extra: str) -> list[str]:
    """The command of the shared trained runs (``trained_run``, ``trained_run_ray``) with another step budget and
    directory: what a test runs to continue a copy of one (the budget is not part of a run's identity)."""
    return overrides(ws, out, steps, "trainer.val_before_train=true", *extra)


def _train(ws: Path, out: Path, *extra: str, ray_address: str | None = None) -> None:
    args = trained_run_args(ws, out, TRAINED_STEPS, *extra)
    done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=main_env(args, ray_address))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, workspace) -> Path:
    """A finished 4-step run on the workspace (one process, a checkpoint after every step, a validation before
    step 1), trained once per test run; tests continue copies of it (``copy_run``), never the run itself."""
    return built_once(tmp_path_factory, "trained_run", lambda d: _train(workspace, d))


@pytest.fixture(scope="session")
def trained_run_ray(tmp_path_factory, workspace, ray_address) -> Path:
    """The same run through 2 Ray ranks (sharded checkpoints, an engine per rank)."""
    return built_once(tmp_path_factory, "trained_run_ray",
                      lambda d: _train(workspace, d, *RAY_WORLD_2, ray_address=ray_address))


def copy_run(run: Path, dest: Path, step: int, checkpoints: bool = True) -> Path:
    """``dest``: a copy of the run directory ``run`` as a run of the same command leaves it when it is killed right
    after step ``step``'s checkpoint: the checkpoints of later steps, the final model, the plots and the metrics
    of later steps removed (``checkpoints=False``: no checkpoint at all, as a run with trainer.save_freq=-1)."""
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns(".built"))
    for path in dest.iterdir():
        later = path.name.startswith("global_step_") and (not checkpoints or int(path.name.split("_")[-1]) > step)
        if later or path.name in ("hf_model", "curves.png"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    marker = dest / "latest_checkpointed_iteration.txt"
    if checkpoints:
        marker.write_text(str(step))
    else:
        marker.unlink(missing_ok=True)
    kept = [line for line in (dest / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= step]
    (dest / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
    return dest


def final_weights(ws: Path, out: Path) -> dict[str, torch.Tensor]:
    """The weights of the model directory ``out / "hf_model"`` (or ``out`` itself when it is a model directory)."""
    from transformers import AutoModelForCausalLM

    model_dir = out if (out / "config.json").exists() else out / "hf_model"
    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


