"""Log-probs and entropy of the sampled tokens from a model's logits, as pure tensor functions.

Shapes: B rows, T response tokens, V vocabulary. Choices:

* **Log-probs** as ``gather(logits) - logsumexp(logits)``: no [B, T, V] log-softmax output is
  kept for backward (half-precision logits are upcast one row at a time).
* **Entropy** computed on logits shifted by their (detached) maximum: without the shift both of
  its terms grow with the logits and cancel catastrophically.
  These two (``logprobs_from_logits``, ``entropy_from_logits``) are the plain definitions: the trainer computes both
  through ``logprobs_and_entropy`` below, and the tests check it against them.
* **Chunked** over tokens (``logprobs_and_entropy``) in both passes, with a backward written out
  (``_ChunkedLogprobs``) that fills one gradient of the logits' shape chunk by chunk: with a 151k or 262k
  vocabulary nothing but the logits and their gradient spans [B, T, V]. (Activation checkpointing of
  sliced chunks, used before, made autograd allocate a whole-size gradient per chunk.)
* **In place within a chunk**: a chunk's float32 upcast is shifted, exponentiated and turned into its gradient in
  its own buffer (one more for exp in the forward), the logsumexp shared by the log-probs and the entropy. On a CPU
  each pass over a [c, V] chunk is memory-bound: with a fresh tensor per operation the forward took 2.6x as long
  (docs/history/results-journal.md, "Freed host memory kept for reuse").
"""

from __future__ import annotations

import torch
from torch import Tensor


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


def _chunks(B: int, T: int, tokens: int) -> list[tuple[int, slice]]:
    """(row, token slice) pieces of at most ``tokens`` tokens covering a [B, T] grid, row by row (views of a
    [B, T, V] tensor cut this way are never copies, even when its rows are strided)."""
    return [(b, slice(t, min(t + tokens, T))) for b in range(B) for t in range(0, T, tokens)]


class _ChunkedLogprobs(torch.autograd.Function):
    """Log-probs and entropy of [B, T, V] logits, chunk by chunk in both passes.

    The backward writes each chunk's gradient straight into one gradient tensor of the logits' shape and dtype,
    from the closed forms d log p(y) / dz = onehot(y) - p and dH / dz = -p * (log p + H). Autograd through sliced
    chunks (what activation checkpointing of a slice gives) instead allocates a zero-filled gradient of the whole
    [B, T, V] per chunk and sums them: several copies of the logits alive, and every chunk touching all of them.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, with_entropy: bool, entropy_grad: bool,
                tokens: int) -> tuple[Tensor, Tensor]:
        B, T, _ = logits.shape
        log_prob = logits.new_zeros(B, T, dtype=torch.float32)  # [B, T]
        entropy = logits.new_zeros(B, T, dtype=torch.float32)  # [B, T]
        for b, cut in _chunks(B, T, tokens):
            # two [c, V] float32 buffers and six passes over them (the logits shifted by their maximum, then
            # exp(shifted)), not a fresh tensor per operation: on a CPU these passes are most of the head's time
            z = logits[b, cut].to(torch.float32, copy=True)  # [c, V]
            z -= z.amax(dim=-1, keepdim=True)  # shifted: max 0 per token
            e = torch.exp(z)  # [c, V]
            total = e.sum(dim=-1)  # [c]
            log_total = total.log()  # logsumexp of the shifted logits
            log_prob[b, cut] = z.gather(-1, labels[b, cut].unsqueeze(-1)).squeeze(-1) - log_total
            if with_entropy:  # H = logsumexp(z) - sum(softmax(z) z), on the shifted z (entropy_from_logits)
                entropy[b, cut] = log_total - e.mul_(z).sum(dim=-1) / total
        ctx.save_for_backward(logits, labels)
        ctx.entropy_grad, ctx.tokens = with_entropy and entropy_grad, tokens
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_log_prob: Tensor, grad_entropy: Tensor):
        logits, labels = ctx.saved_tensors
        B, T, _ = logits.shape
        grad = torch.empty_like(logits)  # [B, T, V], the logits' dtype
        for b, cut in _chunks(B, T, ctx.tokens):
            g_lp = grad_log_prob[b, cut].unsqueeze(-1)  # [c, 1]
            z = logits[b, cut].to(torch.float32, copy=True)  # [c, V], then in place: shifted, exp, p, the gradient
            z -= z.amax(dim=-1, keepdim=True)
            if ctx.entropy_grad:  # needs log p beside p (a second buffer); g = -p (g_lp + g_H (log p + H))
                g = z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))  # log p, in place
                p = g.exp()  # [c, V]
                h = -torch.bmm(p.unsqueeze(1), g.unsqueeze(2)).view(-1, 1)  # [c, 1], the entropy; no [c, V] product
                g.add_(h).mul_(grad_entropy[b, cut].unsqueeze(-1)).add_(g_lp).mul_(p).neg_()
            else:
                g = z.exp_()
                g *= (-g_lp) / g.sum(dim=-1, keepdim=True)  # -p * d loss / d log p(y)
            g.scatter_add_(-1, labels[b, cut].unsqueeze(-1), g_lp)
            grad[b, cut] = g
        return grad, None, None, None, None


def logprobs_and_entropy(logits: Tensor, labels: Tensor, with_entropy: bool = False, entropy_grad: bool = False,
                         chunk_bytes: int = LOGITS_CHUNK_BYTES) -> tuple[Tensor, Tensor | None]:
    """Log-probs of ``labels`` [B, T] under ``logits`` [B, T, V], and the entropy [B, T] if asked, in float32.

    Computed over chunks of tokens whose float32 temporaries (the upcast, the softmax) take about
    ``chunk_bytes``, in the forward and the backward pass (``_ChunkedLogprobs``), so with a 151k or 262k
    vocabulary the only [B, T, V] tensors are the logits and, with gradients, their gradient.
    ``entropy_grad`` keeps the entropy in the autograd graph (a bonus term); otherwise it is computed
    without gradient (a metric).
    """
    B, T, V = logits.shape
    if B * T == 0:
        zeros = logits.new_zeros(B, T, dtype=torch.float32)
        return zeros, (zeros.clone() if with_entropy else None)
    tokens = max(1, chunk_bytes // (4 * V))
    log_prob, entropy = _ChunkedLogprobs.apply(logits, labels, with_entropy, entropy_grad, tokens)
    return log_prob, (entropy if with_entropy else None)
