"""The entry points end to end on CUDA, each in this process (``tests/entry_points.py``) with the real BM25 retrieval
service on loopback: one GRPO and one PPO step of ``verl.trainer.main_ppo`` (``trainer.device=cuda``,
``trainer.backend=local``, the HF engine, bfloat16), SFT steps of ``verl.trainer.main_sft`` (compared with the same
steps on the CPU) and ``search_r1.evaluate`` (the memorised trajectories, token for token, as on the CPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from tests.entry_points import in_process, main_ppo_in_process
from tests.gpu.gpu_helpers import DEVICE
from tests.search_r1.memorised_policy import QUESTIONS, TOPK
from tests.verl.trainer.sft_test_utils import scripted_rows, tiny_sft_model, write_rows

pytestmark = pytest.mark.gpu

FRANCE, TOKYO = QUESTIONS


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _train_args(policy_dir: Path, data: Path, url: str, out: Path, *extra: str) -> list[str]:
    """One step on the memorised policy (it searches, then answers), 4 prompts, the lengths its trajectories fit."""
    return [f"data.train_files={data}", f"data.val_files={data}", f"actor_rollout_ref.model.path={policy_dir}",
            f"trainer.device={DEVICE}", "trainer.backend=local", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
            f"retriever.url={url}", f"retriever.topk={TOPK}", "max_turns=2", "data.max_obs_length=96",
            "data.max_start_length=256", "data.max_prompt_length=640", "data.max_response_length=64",
            "data.max_trajectory_length=320", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.temperature=0.2",  # the memorised tokens win by a margin, not a mile
            "actor_rollout_ref.actor.optim.lr=1e-4", "critic.optim.lr=1e-4", "trainer.total_training_steps=1",
            "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.val_before_train=false",
            "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}", *extra]


@pytest.fixture(scope="module")
def train_parquet(tmp_path_factory) -> Path:
    """Each of the policy's two questions twice (a batch of 4 prompts)."""
    path = tmp_path_factory.mktemp("gpu_train") / "train.parquet"
    rows_to_parquet([make_row("toy", q, [a], "train", i) for i, (q, (_, a)) in enumerate(list(QUESTIONS.items()) * 2)],
                    path)
    return path


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_one_step_through_the_trainer_with_search(algorithm, policy, train_parquet, service_url, tmp_path):
    """Guards the trainer's GPU path as a user runs it (issue 56: every GRPO run failed at its first sampled token):
    one step with the real retrieval service exits 0, searched, updated with finite losses (the critic's too under
    PPO) and, on a GPU, measured its device memory."""
    extra = ["--config", "configs/grpo.yaml", "actor_rollout_ref.rollout.n=2"] if algorithm == "grpo" else []
    out = tmp_path / algorithm
    done = main_ppo_in_process(*extra, *_train_args(policy[0], train_parquet, service_url, out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (step,) = _metrics(out)
    assert step["step"] == 1 and step["agent/searches_per_traj"] > 0, json.dumps(step)
    assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
    if algorithm == "ppo":
        assert math.isfinite(step["critic/vf_loss"])
    if DEVICE == "cuda":
        assert step["perf/max_memory_allocated_gb"] > 0
    assert (out / "global_step_1").is_dir() and (out / "hf_model" / "config.json").is_file()


def test_sft_steps_on_the_device_match_the_cpu(tmp_path):
    """Guards ``main_sft`` on the device: two float32 steps give the CPU's losses (the same data order, the same
    update), and in bfloat16 the losses stay within bfloat16 rounding of them; each run exports its model."""
    tiny_sft_model(tmp_path)
    write_rows(scripted_rows(range(16)), tmp_path / "train.parquet")
    losses = {}
    runs = {"cpu": ("cpu", "float32"), "fp32": (DEVICE, "float32"), "bf16": (DEVICE, "bfloat16")}
    for name, (device, dtype) in runs.items():
        out = tmp_path / name
        done = in_process("verl.trainer.main_sft", f"model.partial_pretrain={tmp_path / 'model'}",
                          f"data.train_files={tmp_path / 'train.parquet'}", f"trainer.default_local_dir={out}",
                          "data.train_batch_size=8", "data.micro_batch_size_per_gpu=4", "trainer.logger=[jsonl]",
                          f"trainer.device={device}", f"model.dtype={dtype}", "optim.lr=1e-3",
                          "trainer.total_training_steps=2")
        assert done.returncode == 0, done.stderr[-3000:]
        assert (out / "hf_model" / "config.json").is_file()
        losses[name] = [r["train/loss"] for r in _metrics(out)]
    assert len(losses["cpu"]) == 2 and all(math.isfinite(v) for v in losses["cpu"])
    assert losses["fp32"] == pytest.approx(losses["cpu"], rel=1e-4)
    assert losses["bf16"] == pytest.approx(losses["cpu"], rel=0.03)


def test_evaluate_on_the_device_gives_the_memorised_trajectories(policy, service_url, tmp_path):
    """Guards ``search_r1.evaluate`` on the device: the greedy trajectories through the real service are the ones
    the policy memorised, token for token, scored as on the CPU (``tests/search_r1/test_evaluate.py``)."""
    model_dir, tokenizer, _, responses, _ = policy
    rows = [("src_a", FRANCE, ["Paris"]), ("src_a", TOKYO, ["Osaka"])]
    data = tmp_path / "test.parquet"
    rows_to_parquet([make_row(s, q, g, "test", i) for i, (s, q, g) in enumerate(rows)], data)
    out = tmp_path / "eval"
    done = in_process("search_r1.evaluate", "--model", model_dir, "--data", data, "--retriever-url", service_url,
                      "--out", out, "--batch-size", "2", f"retriever.topk={TOPK}", f"trainer.device={DEVICE}")
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["response"] for r in records] == [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
    assert [(r["em"], r["stop_reason"]) for r in records] == [(1.0, "answered"), (0.0, "answered")]
    assert json.loads((out / "results.json").read_text())["overall"]["em"] == 0.5
