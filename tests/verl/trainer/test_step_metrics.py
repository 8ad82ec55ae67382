"""The step metrics the trainer logs from a batch (``verl.trainer.step_metrics``; pure functions: no model, no run).

Guards against a validation mean per data source taken over the wrong rows, an on-policy step logging its rollout
mismatch under another key than an off-policy one, and a resumed run that forgets the validation before its first
step. Each is checked against a plain loop.
"""

from __future__ import annotations

import json

import pytest
import torch

from verl.protocol import Batch
from verl.trainer.step_metrics import logged_validations, mismatch_metrics, update_metrics, validation_metrics


def test_validation_means_per_source_match_a_plain_loop():
    per_row = {"data_source": ["nq", "hotpotqa", "nq", "nq"], "score": [1.0, 0.0, 0.0, 1.0],
               "searches": [2, 1, 0, 1]}
    got = validation_metrics(per_row)
    expected = {}
    for name in ("score", "searches"):
        values = per_row[name]
        expected[f"val/{name}"] = sum(values) / len(values)
        for source in ("hotpotqa", "nq"):
            mine = [v for v, s in zip(values, per_row["data_source"]) if s == source]
            expected[f"val/{name}/{source}"] = sum(mine) / len(mine)
    assert got == pytest.approx(expected)
    assert list(got) == list(expected)  # the order the tracker logs them in


def test_on_and_off_policy_steps_log_the_mismatch_under_the_same_keys():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # [B, R], 1 = sampled by the policy
    batch = Batch({"response_mask": mask, "info_mask": torch.ones_like(mask),
                   "old_log_probs": torch.zeros(2, 3), "rollout_log_probs": torch.full((2, 3), -0.1)}, {})
    off_policy = mismatch_metrics(batch)
    from_update = update_metrics({f"actor/rollout_{k.removeprefix('rollout/')}": v for k, v in off_policy.items()}
                                 | {"actor/pg_loss": 0.5})
    assert off_policy and set(off_policy) | {"actor/pg_loss"} == set(from_update)
    assert mismatch_metrics(Batch({"response_mask": mask, "info_mask": mask}, {})) == {}  # on-policy: none here


def test_a_resumed_run_reads_the_first_and_the_latest_validation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert logged_validations(path) == ({}, {})
    records = [{"step": 0, "val/score": 0.1}, {"step": 1, "actor/pg_loss": 0.2},
               {"step": 2, "val/score": 0.3, "actor/pg_loss": 0.1}, {"step": 3, "actor/pg_loss": 0.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert logged_validations(path) == ({"val/score": 0.1}, {"val/score": 0.3})
