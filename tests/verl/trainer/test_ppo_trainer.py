"""End-to-end trainer tests through the real entry point (tiny model, HF rollout, no mocks).

Guards against: a resumed run that differs from an uninterrupted one (dataloader position, RNG,
optimizer/scheduler state or sampling seeds not restored), a crash while saving leaving a
checkpoint that auto-resume would pick up, and config errors that do not name the key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import save_tiny_model
from search_r1.prompts import make_prompt
from verl.config import ConfigError, load_config

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


def overrides(ws: Path, out: Path, steps: int) -> list[str]:
    return [
        f"data.train_files={ws / 'train.parquet'}", f"data.val_files={ws / 'test.parquet'}",
        f"actor_rollout_ref.model.path={ws / 'model'}", "actor_rollout_ref.rollout.name=hf",
        "data.train_batch_size=4", "data.max_response_length=24", "data.max_obs_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size=1",
        "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size=1", "actor_rollout_ref.actor.lr=1e-3",
        "do_search=false", f"custom_reward_function.path={ws / 'reward.py'}",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}",
    ]


def run_main(args: list[str], **popen_kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen_kwargs)


def final_weights(ws: Path, out: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(out / "hf_model").state_dict()


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_kill_and_resume_matches_uninterrupted_run(workspace, tmp_path):
    """SIGKILL after step 2's checkpoint, resume with resume_mode=auto: same metrics and final weights
    as a run that was never interrupted (guards the dataloader position, optimizer, scheduler, RNG
    and per-step sampling seeds in the checkpoint)."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    proc = run_main(overrides(workspace, straight, 4))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out

    proc = run_main(overrides(workspace, killed, 4))
    deadline = time.time() + 600
    while not (killed / "global_step_2" / "trainer.pt").exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "hf_model").exists(), "the killed run must not have finished"
    proc = run_main(overrides(workspace, killed, 4))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "resuming from" in out

    a, b = metrics(straight), metrics(killed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        for key in ("critic/score/mean", "actor/pg_loss", "critic/vf_loss"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-7), (ra["step"], key)
    wa, wb = final_weights(workspace, straight), final_weights(workspace, killed)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-5, atol=1e-6, msg=name)
    # The weights did move: the run trained something.
    from transformers import AutoModelForCausalLM
    w0 = AutoModelForCausalLM.from_pretrained(workspace / "model").state_dict()
    assert any(not torch.equal(w0[n], wa[n]) for n in wa)


def test_half_written_checkpoint_is_not_resumed(workspace, tmp_path):
    """A crash while saving leaves global_step_N.tmp and an unchanged marker: auto-resume ignores it."""
    from verl.utils import checkpoint

    tmp = checkpoint.begin(tmp_path, 3)
    (tmp / "actor").mkdir()
    assert checkpoint.find_latest(tmp_path) is None
    checkpoint.commit(tmp_path, checkpoint.begin(tmp_path, 1), 1, {"step": 1}, "x: 1\n")
    assert checkpoint.find_latest(tmp_path) == tmp_path / "global_step_1"


@pytest.mark.parametrize("override, needle", [
    ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator"),
    ("trainer.backend=slurm", "trainer.backend"),
    ("data.train_batch_size=0", "data.train_batch_size"),
    ("actor_rollout_ref.actor.lossagg=1", "lossagg"),
    ("data.max_prompt_length=abc", "data.max_prompt_length"),
])
def test_bad_config_names_the_key(override, needle):
    """Config errors must name the offending key (and the allowed values for choices)."""
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config([override])


def test_grpo_needs_groups():
    """GRPO with n=1 would silently give zero advantages; the config refuses it."""
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config(["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"])
