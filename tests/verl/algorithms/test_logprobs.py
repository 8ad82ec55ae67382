"""Tests of log-probs and entropy from logits (``verl.algorithms.logprobs``) against plain loops written here."""

from __future__ import annotations

import math

import pytest
import torch

from tests.verl.algorithms.memory_meter import LiveBytes
from verl.algorithms import logprobs as lp


def test_entropy_and_logprobs_match_loop() -> None:
    """Guards against an entropy/log-prob that overflows on large logits or gathers the wrong token."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(3, 4, 7, generator=gen) * 5
    logits[0, 0] += 1e4  # huge but finite logits must stay finite
    labels = torch.randint(0, 7, (3, 4), generator=gen)
    entropy = lp.entropy_from_logits(logits)
    logprobs = lp.logprobs_from_logits(logits, labels)
    for i in range(3):
        for t in range(4):
            z = [float(v) for v in logits[i, t]]
            top = max(z)
            log_norm = top + math.log(sum(math.exp(v - top) for v in z))
            probs = [math.exp(v - log_norm) for v in z]
            ent = -sum(p * (v - log_norm) for p, v in zip(probs, z, strict=True))
            assert float(entropy[i, t]) == pytest.approx(ent, rel=1e-4, abs=1e-4)
            # float32 holds a logit of 1e4 to ~1e-3: the log-prob is exact up to that rounding
            tol = 1e-5 * max(1.0, abs(top))
            assert float(logprobs[i, t]) == pytest.approx(z[int(labels[i, t])] - log_norm, rel=1e-5, abs=tol)


def test_logprobs_half_precision_upcasts() -> None:
    """Guards against bf16 log-softmax precision loss: bf16 logits give float32 log-probs equal to
    those of the same logits in float32."""
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 3, 50, generator=gen) * 4).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 3), generator=gen)
    out = lp.logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, lp.logprobs_from_logits(logits.float(), labels))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_logprobs_and_entropy_equal_the_plain_ones(dtype) -> None:
    """Guards against the chunked (memory-bounded) log-prob/entropy path differing from the plain
    definitions in value or gradient: chunks of 3 tokens (a budget of 3 vocab rows) over 2 x 5
    tokens, checkpointed under autograd, must give the same values and gradients (entropy bonus on)."""
    gen = torch.Generator().manual_seed(11)
    logits = (torch.randn(2, 5, 13, generator=gen) * 3).to(dtype)
    labels = torch.randint(0, 13, (2, 5), generator=gen)
    weights = torch.randn(2, 5, generator=gen)
    leaves = [logits.clone().requires_grad_(True) for _ in range(2)]
    log_prob, entropy = lp.logprobs_and_entropy(leaves[0], labels, with_entropy=True, entropy_grad=True,
                                                chunk_bytes=3 * 4 * 13)
    plain_log_prob = lp.logprobs_from_logits(leaves[1].float(), labels)
    plain_entropy = lp.entropy_from_logits(leaves[1].float())
    torch.testing.assert_close(log_prob, plain_log_prob)
    torch.testing.assert_close(entropy, plain_entropy)
    (weights * (log_prob - 0.1 * entropy)).sum().backward()
    (weights * (plain_log_prob - 0.1 * plain_entropy)).sum().backward()
    torch.testing.assert_close(leaves[0].grad, leaves[1].grad)
    # without the bonus the entropy is a metric: no graph through it
    log_prob, entropy = lp.logprobs_and_entropy(leaves[0], labels, with_entropy=True, entropy_grad=False,
                                                chunk_bytes=3 * 4 * 13)
    assert log_prob.requires_grad and not entropy.requires_grad
    assert lp.logprobs_and_entropy(leaves[0], labels)[1] is None
    # and the log-probs' own gradient (the backward's branch without the bonus, what a policy loss alone takes)
    leaves = [logits.clone().requires_grad_(True) for _ in range(2)]
    log_prob, _ = lp.logprobs_and_entropy(leaves[0], labels, with_entropy=True, chunk_bytes=3 * 4 * 13)
    (weights * log_prob).sum().backward()
    (weights * lp.logprobs_from_logits(leaves[1].float(), labels)).sum().backward()
    torch.testing.assert_close(leaves[0].grad, leaves[1].grad)


def test_chunked_logprobs_memory_stays_flat_for_a_262k_vocabulary() -> None:
    """Guards against chunking that bounds the forward only: with Gemma 3's 262,144-token vocabulary, what the
    log-probs and the entropy bonus hold at once in the forward and backward passes beyond the logits' own gradient
    must be a few chunks' worth whatever the number of tokens (16 or 128). Autograd through sliced, checkpointed
    chunks allocated a whole-size gradient per chunk: 8 chunks' worth at 16 tokens, 16 at 128. The plain
    (unchunked) computation measured the same way holds several float32 copies of the logits."""
    vocab, chunk_tokens = 262_144, 8
    chunk_bytes = chunk_tokens * 4 * vocab  # 8 MiB of float32 temporaries per chunk
    gen = torch.Generator().manual_seed(0)
    extra_chunks = {}
    for tokens in (16, 128):
        logits = torch.randn(1, tokens, vocab, generator=gen).to(torch.bfloat16).requires_grad_(True)  # 64 MiB at 128
        labels = torch.randint(0, vocab, (1, tokens), generator=gen)
        with LiveBytes(known=[logits, labels]) as meter:
            log_prob, entropy = lp.logprobs_and_entropy(logits, labels, with_entropy=True, entropy_grad=True,
                                                        chunk_bytes=chunk_bytes)
            (log_prob - 0.01 * entropy).sum().backward()
        gradient = logits.numel() * logits.element_size()  # the logits' gradient: [1, T, V] bf16, unavoidable
        extra_chunks[tokens] = (meter.peak - gradient) / chunk_bytes
    assert extra_chunks[128] <= 7 and abs(extra_chunks[128] - extra_chunks[16]) < 0.01, extra_chunks  # + [B, T] columns
    logits, labels = logits[:, :16].detach().requires_grad_(True), labels[:, :16]
    with LiveBytes(known=[logits, labels]) as meter:
        z = logits.float()  # [1, 16, V]
        (lp.logprobs_from_logits(z, labels) - 0.01 * lp.entropy_from_logits(z)).sum().backward()
    assert meter.peak >= 3 * z.numel() * 4  # the meter sees the plain path's float32 copies
