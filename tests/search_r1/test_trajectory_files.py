"""A fresh run keeps its trajectories: a sample of every training step's rows in ``RUN_DIR/rollouts/`` and of every
validation's generations in ``RUN_DIR/validation/``, bounded, in the trajectory record format
(verl/utils/rollout_log.py).

Guards against issue 57's item 2: training trajectories were kept only when the user knew trainer.rollout_data_dir,
validation generations never (trainer.validation_data_dir was accepted as "no effect"), so a user could not see from
a run whether passages reached the policy. The policy is the memorised one (tests/search_r1/memorised_policy.py):
greedy, its first step's trajectories are known token for token, so the kept segments can be checked against them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from tests.entry_points import main_ppo_in_process
from tests.search_r1.memorised_policy import QUESTIONS, TOPK
from tests.trajectory_records import check_record

pytestmark = pytest.mark.slow  # trains


def run_args(policy, service_url: str, data: Path, out: Path, *extra: str) -> list[str]:
    """GRPO (2 samples of each of the 2 questions a step), greedy: the memorised trajectories."""
    return ["--config", "configs/grpo.yaml", f"data.train_files={data}", f"data.val_files={data}",
            f"actor_rollout_ref.model.path={policy[0]}", "actor_rollout_ref.rollout.name=hf",
            f"retriever.url={service_url}", f"retriever.topk={TOPK}", "max_turns=2", "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.temperature=0", "data.max_obs_length=160",
            "data.max_start_length=256", "data.max_prompt_length=640", "data.max_response_length=64",
            "data.max_trajectory_length=320", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.save_freq=-1",
            "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}", "trainer.device=cpu", *extra]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def data(tmp_path) -> Path:
    rows = [make_row("toy", q, [a], "train", i) for i, (q, (_, a)) in enumerate(QUESTIONS.items())]
    rows_to_parquet(rows, tmp_path / "train.parquet")
    return tmp_path / "train.parquet"


def test_a_fresh_run_keeps_bounded_trajectories_and_validation_generations(policy, service_url, data, tmp_path):
    """Two steps with a validation before and after each, 2 training rows and 1 validation row kept of 4 and 2:
    the files of every step and validation, whole groups, every field of the contract; step 1's rows are the
    memorised trajectories: a policy turn, the inserted <information> block of the one search, the answer."""
    _, tokenizer, _, responses, masks = policy
    out = tmp_path / "run"
    done = main_ppo_in_process(*run_args(policy, service_url, data, out, "trainer.total_training_steps=2",
                                         "trainer.test_freq=1", "trainer.rollout_data_rows=2",
                                         "trainer.validation_data_rows=1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in (out / "rollouts").iterdir()) == ["1.jsonl", "2.jsonl"]
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["0.jsonl", "1.jsonl", "2.jsonl"]
    for step in (1, 2):
        records = read(out / "rollouts" / f"{step}.jsonl")
        assert len(records) == 2 and len({r["group"] for r in records}) == 1  # one whole group of 2 samples
        assert [r["uid"] for r in records] == [f"{records[0]['group']}-0", f"{records[0]['group']}-1"]
        for record in records:
            check_record(record, "train")
            assert record["step"] == step and isinstance(record["advantage"], float)
            assert record["min_version"] == record["max_version"] == step - 1
    for step in (0, 1, 2):
        (record,) = read(out / "validation" / f"{step}.jsonl")
        check_record(record, "val")
        assert record["step"] == step and record["advantage"] is None
    for record in read(out / "rollouts" / "1.jsonl") + read(out / "validation" / "0.jsonl"):
        question = list(QUESTIONS)[record["index"]]
        query, answer = QUESTIONS[question]
        mask = masks[record["index"]]
        runs = [mask.index(0), mask.count(0), len(mask) - mask.index(0) - mask.count(0)]
        assert [(s["kind"], s["tokens"]) for s in record["segments"]] == list(zip(["policy", "inserted", "policy"],
                                                                                   runs, strict=True))
        inserted = record["segments"][1]["text"]
        assert inserted == tokenizer.decode(responses[record["index"]][runs[0]:runs[0] + runs[1]])
        assert "<information>" in inserted and question in record["input"]
        assert (record["queries"], record["answer"], record["ground_truth"]) == ([query], answer, [answer])
        assert (record["score"], record["num_searches"], record["turns"], record["stop_reason"]) == \
            (1.0, 1, 2, "answered")


def test_validation_data_dir_acts_as_in_verl(policy, service_url, data, tmp_path):
    """trainer.validation_data_dir=DIR puts the validation's generations in DIR/<step>.jsonl (here a validation-only
    run: step 0), not in the run directory; every row is kept when the validation has no more than the cap."""
    out, dump = tmp_path / "run", tmp_path / "val_dump"
    done = main_ppo_in_process(*run_args(policy, service_url, data, out, "trainer.val_only=true",
                                         f"trainer.validation_data_dir={dump}"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = read(dump / "0.jsonl")
    assert sorted(r["index"] for r in records) == [0, 1] and not (out / "validation").exists()
    for record in records:
        check_record(record, "val")
