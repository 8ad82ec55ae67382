"""GSPO (``policy_loss.loss_mode=gspo``) against its formula, written out here with explicit loops."""

from __future__ import annotations

import math

import pytest
import torch

from verl.trainer.core_algos import POLICY_LOSSES

GSPO = POLICY_LOSSES.get("gspo")


def _case(seed: int, B: int = 5, T: int = 7, scale: float = 0.05):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=gen) * 3
    new = (old + scale * torch.randn(B, T, generator=gen)).requires_grad_(True)
    mask = (torch.rand(B, T, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    adv = torch.randn(B, 1, generator=gen).expand(B, T).contiguous()  # one advantage per sequence (GRPO)
    return old, new, mask, adv


def _reference(old, new, mask, adv, low, high):
    """(1 / B) sum_i max(-A_i s_i, -A_i clip(s_i)) with s_i = exp(mean of the masked log-ratios): the sequence
    objective, whose gradient GSPO's token form must equal."""
    total = 0.0
    for i in range(old.shape[0]):
        idx = [t for t in range(old.shape[1]) if mask[i, t] > 0]
        s = torch.exp(sum(new[i, t] - old[i, t] for t in idx) / len(idx))
        a = adv[i, 0]
        total = total + torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high))
    return total / old.shape[0]


@pytest.mark.parametrize("low, high, scale", [(3e-4, 4e-4, 0.05), (0.2, 0.28, 0.05), (0.2, 0.2, 1e-5)])
def test_gspo_equals_the_sequence_objective_in_value_and_gradient(low, high, scale):
    """Guards against a token-level ratio (PPO's), inserted tokens counted in |y|, the wrong aggregation, and a
    gradient that is not s_i * grad log pi(y_t) / |y_i|; the first case clips most sequences, the last none."""
    old, new, mask, adv = _case(0, scale=scale)
    loss, metrics = GSPO(old, new, adv, mask, low, high, None, "seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, new)
    new_ref = new.detach().clone().requires_grad_(True)
    ref = _reference(old, new_ref, mask, adv, low, high)
    (grad_ref,) = torch.autograd.grad(ref, new_ref)
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-7)
    assert not grad[mask == 0].any()
    ratios = [math.exp(float(((new - old) * mask)[i].sum() / mask[i].sum())) for i in range(old.shape[0])]
    assert float(metrics["seq_ratio_mean"]) == pytest.approx(sum(ratios) / len(ratios), rel=1e-5)


def test_gspo_ignores_inserted_tokens_and_clips_by_sequence():
    """Guards against retrieved (mask 0) tokens moving the ratio, and against clipping per token: a sequence whose
    ratio is outside the range is clipped on all its tokens (clipfrac counts them all)."""
    old, new, mask, adv = _case(1)
    noisy = new.detach().clone()
    noisy[mask == 0] += 5.0  # inserted tokens: any log-prob
    a, _ = GSPO(old, new.detach(), adv, mask, 0.2, 0.2, None, "seq-mean-token-mean")
    b, _ = GSPO(old, noisy, adv, mask, 0.2, 0.2, None, "seq-mean-token-mean")
    assert float(a) == pytest.approx(float(b), abs=1e-7)
    shifted = old + 0.5 * mask  # every sequence's ratio = e^0.5: above 1 + 0.2
    positive = adv.abs()  # A > 0: the clipped term is active
    _, metrics = GSPO(old, shifted, positive, mask, 0.2, 0.2, None, "seq-mean-token-mean")
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1.0)
