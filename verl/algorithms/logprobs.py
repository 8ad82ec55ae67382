"""Log-probs and entropy of the sampled tokens from a model's logits, as pure tensor functions.

Shapes: B rows, T response tokens, V vocabulary. Choices:

* **Log-probs** as ``gather(logits) - logsumexp(logits)``: no [B, T, V] log-softmax output is
  kept for backward (half-precision logits are upcast one row at a time).
* **Entropy** computed on logits shifted by their (detached) maximum: without the shift both of
  its terms grow with the logits and cancel catastrophically.
* **Chunked** over tokens (``logprobs_and_entropy``), each chunk under activation checkpointing when
  gradients are on, so with a 151k vocabulary nothing beyond the logits themselves spans [B, T, V].
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax of ``logits`` [B, T, V] -> [B, T]: logsumexp(z) - sum(softmax(z) * z).

    Computed on z - max(z) (entropy is shift-invariant; the max is detached, so gradients are
    unchanged): without the shift both terms grow with the logits and cancel catastrophically.
    """
    shifted = logits - logits.max(dim=-1, keepdim=True).values.detach()  # [B, T, V], max 0 per token
    probs = torch.softmax(shifted, dim=-1)
    return torch.logsumexp(shifted, dim=-1) - (probs * shifted).sum(dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """Log-probability of ``labels`` [B, T] under ``logits`` [B, T, V] -> [B, T] (float32 for half inputs).

    ``logit[label] - logsumexp(logits)``: backward needs only the logits already held, not a
    second [B, T, V] log-softmax tensor. Half-precision logits are upcast one row at a time.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        return torch.stack([logprobs_from_logits(row.float(), lab) for row, lab in zip(logits, labels, strict=True)])
    picked = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked - torch.logsumexp(logits, dim=-1)


# Bytes of float32 temporaries one chunk of ``logprobs_and_entropy`` may hold: ~0.4k tokens of a
# 151k vocabulary, the whole micro-batch of a small one.
LOGITS_CHUNK_BYTES = 256 << 20


def _chunk_logprobs_and_entropy(logits: Tensor, labels: Tensor, with_entropy: bool,
                                entropy_grad: bool) -> tuple[Tensor, Tensor]:
    """``logprobs_from_logits`` and ``entropy_from_logits`` of a [N, V] chunk, in float32 -> ([N], [N])."""
    z = logits.float()  # [N, V]
    log_prob = logprobs_from_logits(z, labels)
    if not with_entropy:
        return log_prob, torch.zeros_like(log_prob)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = entropy_from_logits(z)
    return log_prob, entropy


def logprobs_and_entropy(logits: Tensor, labels: Tensor, with_entropy: bool = False, entropy_grad: bool = False,
                         chunk_bytes: int = LOGITS_CHUNK_BYTES) -> tuple[Tensor, Tensor | None]:
    """Log-probs of ``labels`` [B, T] under ``logits`` [B, T, V], and the entropy [B, T] if asked, in float32.

    Computed over chunks of tokens whose float32 temporaries (the upcast, the softmax) take at most
    ``chunk_bytes``, so with a 151k vocabulary nothing beyond the logits themselves spans
    [B, T, V]. With gradients each chunk runs under activation checkpointing: its temporaries are
    recomputed in the backward pass instead of being kept, so the backward holds no second
    [B, T, V] tensor either. ``entropy_grad`` keeps the entropy in the autograd graph (a bonus
    term); otherwise it is computed without gradient (a metric).
    """
    B, T, V = logits.shape
    if B * T == 0:
        zeros = logits.new_zeros(B, T, dtype=torch.float32)
        return zeros, (zeros.clone() if with_entropy else None)
    flat_logits, flat_labels = logits.reshape(B * T, V), labels.reshape(B * T)  # [N, V], [N]
    chunk = max(1, chunk_bytes // (4 * V))
    checkpointed = torch.is_grad_enabled() and logits.requires_grad
    log_probs, entropies = [], []
    for start in range(0, B * T, chunk):
        args = (flat_logits[start:start + chunk], flat_labels[start:start + chunk], with_entropy, entropy_grad)
        if checkpointed:
            log_prob, entropy = checkpoint(_chunk_logprobs_and_entropy, *args, use_reentrant=False)
        else:
            log_prob, entropy = _chunk_logprobs_and_entropy(*args)
        log_probs.append(log_prob)
        entropies.append(entropy)
    return torch.cat(log_probs).reshape(B, T), (torch.cat(entropies).reshape(B, T) if with_entropy else None)
