"""Every command that runs a model, run with the model on a (pretend) accelerator: the trainer's GRPO and PPO steps
(rollout, the actor's, reference's and critic's passes and updates, the weight sync), the evaluation, the
rejection-sampled cold start and the supervised step, each against the real retrieval service on loopback.

``tests/fake_cuda.py`` makes ``trainer.device=cuda`` run on a CPU build of torch: tensors on the device live in host
memory, and any op that mixes them with host tensors raises what CUDA raises. Each run must give what the same
command gives on the host (the arithmetic is the host's either way), so a path that moves a tensor to the wrong
device fails here, not at the first step of a user's GPU run.

Guards against: the rollout engine's sampler handing host tokens to a gather against device logits (every GRPO run
on a GPU failed at its first token while CI stayed green), and any other host tensor meeting a device tensor in the
worker passes, SFT, evaluation or cold-start paths.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from tests.entry_points import in_process
from tests.fake_cuda import fake_cuda
from tests.search_r1.memorised_policy import QUESTIONS, TOPK

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

FRANCE, TOKYO = QUESTIONS
ROWS = [(FRANCE, ["Paris"]), (TOKYO, ["Japan"]), (FRANCE, ["Lyon"]), (TOKYO, ["Nippon"])]
VOLATILE = ("timing/", "perf/")  # clocks and memory: not results


@pytest.fixture(scope="module")
def qa(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("device_qa") / "qa.parquet"
    rows_to_parquet([make_row("toy", q, golds, "train", i) for i, (q, golds) in enumerate(ROWS)], path)
    return path


def _run(device: str, module: str, *args) -> object:
    """``python -m MODULE args`` here, on the host or (``cuda``) on the pretend device; must exit 0."""
    if device == "cuda":
        with fake_cuda():
            done = in_process(module, *args)
    else:
        done = in_process(module, *args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _results(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the clocks and memory figures."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE) and not k.endswith("_s")} for row in rows]


def _train_args(policy, qa: Path, url: str, out: Path, device: str, estimator: str, critic_mini: int = 4) -> list[str]:
    return ["--config", "configs/demo.yaml", f"actor_rollout_ref.model.path={policy[0]}",
            f"data.train_files={qa}", f"data.val_files={qa}", f"retriever.url={url}", f"retriever.topk={TOPK}",
            f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.name=hf", "trainer.backend=local",
            f"trainer.device={device}", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            f"critic.ppo_mini_batch_size={critic_mini}", "critic.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.use_kl_loss=true", "data.max_obs_length=96",
            "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.test_freq=2",
            "trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.resume_mode=disable",
            f"trainer.default_local_dir={out}"]


@pytest.mark.parametrize("critic_mini", [4, 2], ids=["on-policy-critic", "value-pass"])
def test_training_steps_on_a_device_match_the_host(policy, qa, service_url, tmp_path, critic_mini):
    """Two PPO steps with every pass there is (rollout with searches and log-probs, the reference for the KL loss,
    the critic's values and update, the actor's update, the weight sync, a validation): the same metrics on the device
    as on the host. The critic either on-policy (its update measures the values and computes its GAE targets on the
    device: config.computes_values_in_update) or with its value pass, the targets computed on the host. (GRPO's
    passes are a subset; its advantages are computed on the host.)"""
    runs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        _run(device, "verl.trainer.main_ppo", *_train_args(policy, qa, service_url, out, device, "gae", critic_mini))
        runs[device] = _results(out)
    assert [sorted(r) for r in runs["cuda"]] == [sorted(r) for r in runs["cpu"]]
    for on_device, on_host in zip(runs["cuda"], runs["cpu"], strict=True):
        for key, value in on_host.items():
            assert on_device[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert sum(row.get("agent/searches_per_traj", 0) for row in runs["cpu"]) > 0  # passages went in on the device
    raw = [json.loads(line) for line in (tmp_path / "cuda" / "metrics.jsonl").read_text().splitlines()]
    assert all(("timing/values" in row) == (critic_mini == 2) for row in raw)  # the critic path it names


def test_evaluation_on_a_device_matches_the_host(policy, qa, service_url, tmp_path):
    """``search_r1.evaluate`` with the engine on the device: the same trajectories, token for token."""
    trajectories = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        _run(device, "search_r1.evaluate", "--model", policy[0], "--data", qa, "--retriever-url", service_url,
             "--out", out, "--batch-size", "2", f"retriever.topk={TOPK}", f"trainer.device={device}")
        trajectories[device] = [json.loads(line)["response"] for line in
                                (out / "trajectories.jsonl").read_text().splitlines()]
    assert trajectories["cuda"] == trajectories["cpu"] and len(trajectories["cpu"]) == len(ROWS)


def test_cold_start_and_sft_on_a_device(policy, qa, service_url, tmp_path):
    """Rejection-sampled cold start, then two supervised steps on its rows, with the model on the device: the same
    kept rows and losses as on the host."""
    kept, losses = {}, {}
    for device in ("cpu", "cuda"):
        rows = tmp_path / f"rft_{device}.parquet"
        _run(device, "data_prep.cold_start", "rft", "--model", policy[0], "--data", qa, "--retriever-url",
             service_url, "--topk", TOPK, "--out", rows, "--n", "2", "--temperature", "0.05", "--batch-size", "8",
             f"trainer.device={device}")
        kept[device] = [r["turns"] for r in pq.read_table(rows).to_pylist()]
        out = tmp_path / f"sft_{device}"
        _run(device, "verl.trainer.main_sft", f"model.partial_pretrain={policy[0]}", f"data.train_files={rows}",
             f"trainer.default_local_dir={out}", "data.train_batch_size=2", "data.micro_batch_size_per_gpu=1",
             "trainer.total_training_steps=2", "trainer.logger=[jsonl]", f"trainer.device={device}")
        losses[device] = [r["train/loss"] for r in _results(out) if "train/loss" in r]
    assert kept["cuda"] == kept["cpu"] and kept["cpu"]
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=1e-5) and len(losses["cpu"]) == 2
