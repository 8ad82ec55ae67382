"""Shared worker machinery: the LR schedule, non-finite gradients, token-budget micro-batches, padding cuts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.verl.workers.worker_test_utils import random_batch
from verl.protocol import Batch
from verl.utils.lr_schedule import lr_schedule_factor
from verl.workers.model_utils import micro_batches
from verl.workers.train_utils import TrainState, global_counts, optimizer_steps_per_training_step


def one_step(state: TrainState, grad_value: float) -> tuple[float, float, bool]:
    for p in state.model.parameters():
        p.grad = torch.full_like(p, grad_value)
    return state._optimizer_step(skip=False)


def test_lr_warmup_matches_the_plain_formula():
    """Guards against a first step at lr 0, warmup counted in training instead of optimiser steps,
    and an LR that keeps changing after warmup."""
    total = optimizer_steps_per_training_step(rows=32, mini_batch_size=8, epochs=2) * 3  # 3 training steps
    assert total == 24
    state = TrainState(nn.Linear(2, 2), lr=0.1, weight_decay=0.0, warmup_ratio=0.25, total_optimizer_steps=total,
                       grad_clip=1.0)
    warmup = 6
    expected = [0.1 * min(1.0, (s + 1) / warmup) for s in range(total)]
    assert [one_step(state, 0.01)[1] for _ in range(total)] == pytest.approx(expected)
    no_warmup = TrainState(nn.Linear(2, 2), 0.1, 0.0, 0.0, total, None)
    assert [one_step(no_warmup, 0.01)[1] for _ in range(3)] == [0.1, 0.1, 0.1]



def test_cosine_schedule_falls_from_the_warmup_peak_to_the_floor_and_betas_reach_adam():
    """Guards against a cosine that starts before the warm-up ends, ends above or below min_lr_ratio x lr, or is
    ignored (constant), and against betas that never reach the optimiser."""
    total, warmup = 10, 2
    state = TrainState(nn.Linear(2, 2), lr=0.1, weight_decay=0.0, warmup_ratio=0.2, total_optimizer_steps=total,
                       grad_clip=None, betas=(0.8, 0.95), schedule="cosine", min_lr_ratio=0.1)
    assert state.optimizer.param_groups[0]["betas"] == (0.8, 0.95)
    lrs = [one_step(state, 0.01)[1] for _ in range(total)]
    cosine = [0.1 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))))
              for s in range(warmup, total)]
    assert lrs == pytest.approx([0.05, 0.1] + cosine)
    assert lrs[2] == pytest.approx(0.1) and lrs[-1] > 0.01 and all(a > b for a, b in zip(lrs[2:], lrs[3:]))
    assert lr_schedule_factor(total + 5, warmup, total, "cosine", 0.1) == pytest.approx(0.1)  # past the end: floor
    with pytest.raises(ValueError, match="allowed: constant, cosine"):
        TrainState(nn.Linear(2, 2), 0.1, 0.0, 0.0, total, None, schedule="linear")

def test_grad_norm_is_reported_before_clipping_and_non_finite_steps_are_skipped():
    """Guards against logging the clipped norm (always <= grad_clip) and against one inf gradient
    writing NaN into every weight."""
    model = nn.Linear(3, 1, bias=False)
    state = TrainState(model, lr=0.1, weight_decay=0.0, warmup_ratio=0.0, total_optimizer_steps=4, grad_clip=0.5)
    grad_norm, _, _ = one_step(state, 2.0)
    assert grad_norm == pytest.approx(2.0 * math.sqrt(3))
    before = model.weight.detach().clone()
    grad_norm, _, _ = one_step(state, math.inf)
    assert not math.isfinite(grad_norm)
    assert torch.equal(model.weight, before)


def test_an_update_that_makes_a_weight_non_finite_is_undone_and_counted():
    """Guards against a finite gradient times an infinite (or overflowing) step size writing Inf/NaN into every
    weight with no skipped update counted (lr=inf trained a model whose 26 tensors were all NaN, exit 0): the step
    is undone, counted in skipped_updates and nonfinite_update, and a finite step afterwards goes through."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    state = TrainState(model, lr=math.inf, weight_decay=0.0, warmup_ratio=0.0, total_optimizer_steps=4, grad_clip=1.0)
    batch = Batch({"x": torch.randn(4, 3), "loss_mask": torch.ones(4, 1)})

    def loss_fn(micro: Batch, counts) -> tuple[torch.Tensor, dict[str, float]]:
        return model(micro["x"]).pow(2).mean(), {}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    metrics = state.update(batch, mini_batch_size=4, epochs=1, split_micro=lambda b: [b], loss_fn=loss_fn)
    assert metrics["skipped_updates"] == 1 and metrics["nonfinite_update"] == 1
    assert metrics["nonfinite_loss"] == 0 and metrics["nonfinite_grad_norm"] == 0  # the gradient was finite
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    for group in state.optimizer.param_groups:
        group["lr"] = 0.1
    metrics = state.update(batch, mini_batch_size=4, epochs=1, split_micro=lambda b: [b], loss_fn=loss_fn)
    assert metrics["skipped_updates"] == 0 and metrics["nonfinite_update"] == 0
    assert all(torch.isfinite(p).all() and not torch.equal(p, before[n]) for n, p in model.named_parameters())


def _padded_tokens(micros: list[Batch]) -> int:
    """What the forward passes compute: per micro-batch, rows x width without the all-padding columns."""
    total = 0
    for micro in micros:
        real_cols = micro["attention_mask"].any(dim=0).nonzero().flatten()
        total += len(micro) * int(real_cols[-1] - real_cols[0] + 1)
    return total


def test_token_budget_micro_batches_hold_every_row_once_respect_the_budget_and_restore_the_order():
    """Guards against rows dropped or duplicated by dynamic batching, outputs handed back out of batch order (each
    row's log-probs on another row), and micro-batches whose padded size exceeds the token budget."""
    batch = random_batch(seed=40, rows=16)
    budget = 48
    micros = micro_batches(batch, rows=4, max_tokens=budget)
    assert sorted(i for rows in micros.rows for i in rows) == list(range(16))
    for micro, rows in zip(micros, micros.rows, strict=True):
        assert torch.equal(micro["input_ids"], batch["input_ids"][rows])
        assert list(micro["uid"]) == [batch["uid"][i] for i in rows]
        assert len(micro) == 1 or _padded_tokens([micro]) <= budget
    assert [i for rows in micros.rows for i in rows] != list(range(16))  # regrouped: the restore has work to do
    assert torch.equal(micros.in_batch_order([m["input_ids"] for m in micros]), batch["input_ids"])
    row_numbers = [torch.tensor([int(u[1:]) for u in m["uid"]]) for m in micros]
    assert micros.in_batch_order(row_numbers).tolist() == list(range(16))
    fixed = micro_batches(batch, rows=5)
    assert [len(m) for m in fixed] == [5, 5, 5, 1]
    assert torch.equal(fixed.in_batch_order([m["input_ids"] for m in fixed]), batch["input_ids"])


def test_token_budget_groups_rows_of_like_length():
    """Guards against grouping rows in batch order under a token budget: an RL batch alternates short answers and
    long searches, so in batch order every micro-batch is as wide as a long row (the padding is computed)."""
    from verl.utils.seq import pack_trajectories

    short, long = [[5] * 3 for _ in range(8)], [[6] * 40 for _ in range(8)]
    responses = [r for pair in zip(short, long, strict=True) for r in pair]  # short, long, short, long, ...
    tensors = pack_trajectories([[7, 8]] * 16, responses, [[1] * len(r) for r in responses], 0)
    batch = Batch(tensors, {"uid": [f"u{i}" for i in range(16)]})
    in_order = [batch.index(list(range(i, i + 2))) for i in range(0, 16, 2)]  # what batch order fits in 90 tokens
    by_length = micro_batches(batch, rows=2, max_tokens=90)
    assert _padded_tokens(by_length) < 0.6 * _padded_tokens(in_order)
    assert {frozenset(len(batch["responses"][i].nonzero()) for i in rows) for rows in by_length.rows} \
        == {frozenset([3]), frozenset([40])}


def test_token_budget_keeps_a_few_long_rows_from_padding_short_ones():
    """Guards against filling each micro-batch up to the budget in length order: a GRPO step's few rows cut at the
    response budget then take short rows into their micro-batch, padded to their width (their update took 1.3-1.5x
    the time; docs/history/results-journal.md). 3 rows of 640 response tokens and 21 of 100 under a budget of 10
    long rows: the long rows go alone, the short ones together, fewer tokens computed than by the greedy fill."""
    from verl.utils.seq import pack_trajectories
    from verl.workers.model_utils import CALL_TOKENS, budget_groups, row_spans

    responses = [[6] * (640 if i % 8 == 3 else 100) for i in range(24)]
    tensors = pack_trajectories([[7, 8]] * 24, responses, [[1] * len(r) for r in responses], 0)
    batch = Batch(tensors, {"uid": [f"u{i}" for i in range(24)]})
    budget = 10 * 642
    micros = micro_batches(batch, rows=4, max_tokens=budget)
    assert sorted(map(sorted, micros.rows)) == sorted([[3, 11, 19], sorted(set(range(24)) - {3, 11, 19})])
    assert all(_padded_tokens([m]) <= budget for m in micros)
    first, last = row_spans(batch["attention_mask"])
    greedy: list[list[int]] = []  # each group filled up to the budget, the rule before
    for i in sorted(range(24), key=lambda i: (-last[i], first[i], i)):
        group = greedy[-1] + [i] if greedy else [i]
        if greedy and len(group) * (max(last[j] for j in group) - min(first[j] for j in group) + 1) <= budget:
            greedy[-1] = group
        else:
            greedy.append([i])
    assert _padded_tokens(micros) + CALL_TOKENS * len(micros) < _padded_tokens([batch.index(g) for g in greedy]) \
        + CALL_TOKENS * len(greedy)
    # one more call costs CALL_TOKENS: rows of nearly one width are not split to save a little padding
    assert len(budget_groups(list(range(6)), [0] * 6, [100, 100, 99, 99, 98, 98], 10_000)) == 1


def test_global_counts_count_tokens_and_non_empty_rows():
    """Guards against counting padding rows (no policy token) as sequences in seq-mean aggregation,
    and against a NaN loss for a mini-batch without policy tokens."""
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 0]])
    counts = global_counts(mask)
    assert (counts.tokens, counts.seqs) == (3.0, 2.0)
    empty = global_counts(torch.zeros(2, 3))
    assert (empty.tokens, empty.seqs) == (1.0, 1.0)  # a loss over no tokens is 0, not 0 / 0


def test_micro_batches_share_the_batch_meta():
    """Guards against losing batch-level meta (e.g. the step) when splitting."""
    batch = random_batch(seed=41, rows=4)
    batch = Batch(batch.tensors, batch.non_tensors, {"step": 3})
    assert all(m.meta == {"step": 3} for m in micro_batches(batch, rows=2, max_tokens=30))
