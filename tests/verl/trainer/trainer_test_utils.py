"""Shared by the trainer tests: a tiny workspace (model, parquet, toy reward), overrides, run helpers.

The fixtures are defined here and imported by ``tests/verl/trainer/conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import save_tiny_model
from search_r1.prompts import make_prompt
from verl.config import DEMO_CONFIG

ROOT = Path(__file__).resolve().parents[3]

REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A dense toy reward so updates are non-trivial: share of letters 'e' in the response."""
    return solution_str.count("e") / max(len(solution_str), 1)
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trainer")
    questions = [f"Who founded the guild number {i} of Vuzaholm" for i in range(16)]
    texts = [make_prompt(q) for q in questions]
    texts += ["the answer is <answer> here </answer> and <search> q </search>"] * 20
    save_tiny_model(root / "model", texts, vocab_size=600)
    rows = [make_row("toy", q, [f"name {i}"], "train", i) for i, q in enumerate(questions)]
    rows_to_parquet(rows, root / "train.parquet")
    rows_to_parquet(rows[:4], root / "test.parquet")
    (root / "reward.py").write_text(REWARD_FN)
    return root


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


@pytest.fixture
def run_main():
    """``run_main(args)`` starts ``python -m verl.trainer.main_ppo args`` in its own session; at teardown
    whatever is left of every session started (a killed run's Ray processes) is killed."""
    sessions: list[subprocess.Popen] = []

    def start(args: list[str]) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        sessions.append(proc)
        return proc

    yield start
    for proc in sessions:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def final_weights(ws: Path, out: Path) -> dict[str, torch.Tensor]:
    """The weights of the model directory ``out / "hf_model"`` (or ``out`` itself when it is a model directory)."""
    from transformers import AutoModelForCausalLM

    model_dir = out if (out / "config.json").exists() else out / "hf_model"
    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


