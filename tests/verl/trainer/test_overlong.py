"""Overlong handling (``algorithm.overlong``) on hand-packed rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import Batch
from verl.trainer import overlong
from verl.utils.seq import pack_trajectories

MAX = 10


def _batch(lengths: list[int], reasons: list[str] | None) -> Batch:
    t = pack_trajectories([[1, 2]] * len(lengths), [[5] * n for n in lengths],
                          [[1, 1, 0] * (n // 3) + [1] * (n % 3) for n in lengths], pad_id=0)
    t["loss_mask"] = t["response_mask"] * t["info_mask"]
    t["token_level_scores"] = torch.zeros(t["responses"].shape)
    non = {"score": np.zeros(len(lengths))}
    if reasons is not None:
        non["stop_reason"] = reasons
    return Batch(t, non)


def test_mask_removes_exactly_the_cut_rows():
    """Guards against masking rows that stopped on their own (a full-length answer) or leaving a cut row in."""
    b = _batch([4, 10, 7, 10], ["answered", "max_length", "max_length", "answered"])
    before = b["loss_mask"].clone()
    m = overlong.apply(b, "mask", MAX, 4, 1.0)
    assert m == {"train/overlong_frac": 0.5, "train/overlong_masked": 2.0}
    assert b["loss_mask"][[1, 2]].sum() == 0 and torch.equal(b["loss_mask"][[0, 3]], before[[0, 3]])
    # no stop reasons (another recipe): a row that fills the budget counts as cut
    b = _batch([4, 10], None)
    assert overlong.apply(b, "none", MAX, 4, 1.0)["train/overlong_frac"] == 0.5
    assert b["loss_mask"].sum() > 0


def test_soft_penalty_equals_dapos_formula_at_the_boundaries():
    """0 up to L_max - L_cache, linear to -factor at L_max, on the last policy token only; score unchanged."""
    lengths = torch.tensor([0, 6, 7, 8, 10, 12])
    got = overlong.soft_penalty(lengths, MAX, 4, 0.5)
    assert got.tolist() == pytest.approx([0, 0, -0.125, -0.25, -0.5, -0.5])
    b = _batch([5, 6, 8, 10], ["answered"] * 3 + ["max_length"])
    m = overlong.apply(b, "soft_penalty", MAX, 4, 1.0)
    assert m["train/overlong_penalty_mean"] == pytest.approx((0 + 0 - 0.5 - 1.0) / 4)
    scores = b["token_level_scores"]
    for row, want in enumerate([0.0, 0.0, -0.5, -1.0]):
        last = int(b["loss_mask"][row].nonzero().max())
        assert float(scores[row, last]) == pytest.approx(want)
        assert float(scores[row].abs().sum()) == pytest.approx(abs(want))
    assert b["score"].tolist() == [0, 0, 0, 0]
