"""Masked statistics and loss aggregation over [B, T] tensors, the building blocks of ``core_algos`` and
``policy_losses`` (re-exported by ``core_algos``).

Every function takes a ``mask`` (1 = the entry counts, 0 = it does not; the trainer passes
``loss_mask = response_mask * info_mask``, so padding and tokens inserted by the environment are 0). Masks may be
bool, int or float. A masked entry never contributes, even when it holds inf/NaN, and receives exactly zero
gradient; masked positions of token-level outputs are 0; an empty mask gives 0, never NaN.

**Loss aggregation** (``agg_loss``): ``token-mean`` (DAPO: every counted token weighs the same),
``seq-mean-token-sum`` (Dr. GRPO: per-sequence sums averaged over sequences) and ``seq-mean-token-mean``
(original GRPO, and GSPO's sequence objective). ``global_tokens`` / ``global_seqs`` replace this micro-batch's
own counts, so summing micro-batch losses (gradient accumulation, data-parallel all-reduce of gradients)
reproduces the full-batch loss exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")  # loss_agg_mode, see ``agg_loss``


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x * mask`` where the mask is nonzero and an exact 0 elsewhere (no inf * 0 = NaN); any shape."""
    w = mask.to(dtype=x.dtype, device=x.device)
    return torch.where(w != 0, x * w, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x * mask`` over ``dim`` (all dims if None). Masked entries never contribute, even
    when they hold inf/NaN, and receive exactly zero gradient."""
    masked = zero_masked(x, mask)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def mask_count(mask: Tensor, like: Tensor, dim: int | None = None) -> Tensor:
    """Number of counted entries (sum of the mask) in ``like``'s dtype, over ``dim``."""
    w = mask.to(dtype=like.dtype, device=like.device)
    return w.sum() if dim is None else w.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x * mask) / max(sum(mask), 1)`` over ``dim``: an empty mask gives 0, never NaN."""
    return masked_sum(x, mask, dim) / mask_count(mask, x, dim).clamp(min=1.0)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked entries of ``x`` (a scalar). With ``unbiased`` the divisor is
    ``count - 1``; it is clamped to at least 1, so one or zero counted entries give 0, not NaN."""
    mean = masked_mean(x, mask)
    sq_dev = masked_sum((x - mean) ** 2, mask)
    count = mask_count(mask, x)
    divisor = count - 1.0 if unbiased else count
    return sq_dev / divisor.clamp(min=1.0)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps), mean and unbiased var over the masked entries only.

    Args:
        x: [B, T] values.
        mask: [B, T], 1 = the entry counts.
        shift_mean: if False the mean is added back (only the scale changes).
    Returns [B, T], 0 at masked positions.
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask, unbiased=True) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return zero_masked(whitened, mask)


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, global_tokens: float | None = None,
             global_seqs: float | None = None) -> Tensor:
    """Aggregate a per-token loss [B, T] into a scalar over the masked tokens.

    Modes:
        token-mean: sum over counted tokens / number of counted tokens.
        seq-mean-token-sum: per-row sums, averaged over sequences.
        seq-mean-token-mean: per-row token means, averaged over sequences.
    A "sequence" is a row with at least one counted token; empty rows (e.g. padding rows of a
    data-parallel shard) count in neither numerator nor denominator.

    Args:
        global_tokens: if given, divide by this instead of this micro-batch's token count; pass
            the counted tokens of the whole (mini-)batch across micro-batches and ranks, so that
            the sum of the micro-batch losses is the full-batch loss.
        global_seqs: likewise for the number of non-empty rows (``(mask.sum(-1) > 0).sum()``).
    """
    if mode == "token-mean":
        denom = mask_count(mask, loss_mat).clamp(min=1.0) if global_tokens is None else global_tokens
        return masked_sum(loss_mat, mask) / denom
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        seq_loss = masked_sum(loss_mat, mask, dim=-1)  # [B]
        if mode == "seq-mean-token-mean":
            seq_loss = seq_loss / mask_count(mask, loss_mat, dim=-1).clamp(min=1.0)
        nonempty = (mask != 0).any(dim=-1)  # [B]
        denom = mask_count(nonempty, loss_mat).clamp(min=1.0) if global_seqs is None else global_seqs
        return masked_sum(seq_loss, nonempty) / denom
    raise ValueError(f"unknown loss_agg_mode {mode!r}: valid are {list(AGG_MODES)}")
