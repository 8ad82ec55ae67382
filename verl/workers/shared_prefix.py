"""Log-probs of a micro-batch whose prompts all start with the same tokens, with that prefix run once.

Every row of a Search-R1 dataset starts with the same instruction (and a chat template's system prompt): in the demo
84 of a trajectory's 159 tokens on average; and the rows of a GRPO group share their whole prompt, so a micro-batch
that holds one group computes its prompt once per row for nothing. Used by the supervised cold start, the actor's
log-prob pass and update and the reference (``PrefixSharing``). Here the prefix runs once ([1, p0]), its keys and values
are repeated for the b rows (``Cache.batch_repeat_interleave``; gradients flow back through the repeat, so the
prefix's weights get the sum of the rows' gradients, as in the full computation), and the rows' remainders run
against that cache.

Layout. ``pack_trajectories`` left-pads prompts, so the prefix sits at another column in every row. Here each row is
rebuilt right-padded, ``[prompt_i] [response_i] [pad]``: the prefix in columns 0..p0-1 of every row, every real token
at the column of its position (no holes, so sliding-window attention sees the distances it sees in the full layout).
The responses then start at another column in each row; the logits that predict them are gathered per row.

The result equals ``model_utils.response_log_probs`` to float rounding (``tests/verl/workers/test_shared_prefix.py``,
values and gradients, on several model families).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from verl.algorithms.logprobs import logprobs_and_entropy
from verl.protocol import Batch
from verl.workers.model_utils import autocast, response_log_probs
from verl.workers.scored_tokens import ScoredTokens, head_logits, head_on

logger = logging.getLogger(__name__)

MIN_PREFIX = 8  # shorter shared prefixes are not worth a second forward call


def batch_prefix_length(batch: Batch) -> int:
    """``common_prefix_length`` of the micro-batch's prompts (``prompts`` [b, P], left-padded)."""
    prompts, attention_mask = batch["prompts"], batch["attention_mask"]
    P = prompts.shape[1]
    lengths = attention_mask[:, :P].sum(dim=1).tolist()
    return common_prefix_length([row[P - n:] for row, n in zip(prompts.tolist(), lengths, strict=True)])


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, at most the shortest prompt's length minus one (each row keeps at least one
    prompt token of its own: the one that predicts its first response token)."""
    if not prompts:
        return 0
    limit = min(len(p) for p in prompts) - 1
    prefix = os.path.commonprefix([list(p[:limit]) for p in prompts])
    return max(0, len(prefix))


def right_padded(batch: Batch) -> tuple[Tensor, Tensor, Tensor, int]:
    """The micro-batch's rows right-padded (module docstring): input_ids and attention_mask [b, T], the column of
    each row's first response token [b], and r, the longest response."""
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]  # [b, P+R] each
    R = batch["responses"].shape[1]
    P = attention_mask.shape[1] - R
    prompt_len = attention_mask[:, :P].sum(dim=1)  # [b]
    response_len = attention_mask[:, P:].sum(dim=1)  # [b]
    width = int((prompt_len + response_len).max())
    ids = torch.zeros((len(input_ids), width), dtype=input_ids.dtype)
    mask = torch.zeros((len(input_ids), width), dtype=attention_mask.dtype)
    for i, (lp, lr) in enumerate(zip(prompt_len.tolist(), response_len.tolist(), strict=True)):
        ids[i, :lp + lr] = input_ids[i, P - lp:P + lr]
        mask[i, :lp + lr] = 1
    return ids, mask, prompt_len, int(response_len.max())


def shared_prefix_log_probs(model: nn.Module, batch: Batch, p0: int, device: torch.device, dtype: torch.dtype,
                            with_entropy: bool = False, entropy_grad: bool = False,
                            every_token: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [b, R] of ``responses`` and the entropy [b, R] if asked, as ``model_utils.response_log_probs``
    computes them (at the same scored tokens), with the ``p0`` prompt tokens every row starts with run once."""
    ids, mask, first, r = right_padded(batch)
    responses = batch["responses"]
    rows, R = responses.shape
    width = ids.shape[1]
    positions = torch.arange(width, device=device).expand(rows, -1)  # [b, T]: right padding, no holes
    ids, mask = ids.to(device), mask.to(device)
    # the LM head runs on the columns from the one before the earliest response on: the last `keep` of the T
    # columns; the kept column predicting response token k of row i is first_i - 1 + k - (T - keep), clamped on
    # padding
    keep = width - int(first.min()) + 1
    column = (first.to(device)[:, None] - 1 - (width - keep) + torch.arange(r, device=device)).clamp(max=keep - 1)
    # the LM head on the scored tokens only (scored_tokens.py), every real one when the batch has no loss_mask
    scored = ScoredTokens.of(batch, r, device, every_token)
    index = scored.rows * keep + column[scored.rows, scored.cols]  # [n] into the head's input [b * keep]
    with autocast(device, dtype):
        cache = model(input_ids=ids[:1, :p0], position_ids=positions[:1, :p0], use_cache=True,
                      logits_to_keep=1).past_key_values  # only its keys and values are used
        cache.batch_repeat_interleave(rows)
        with head_on(model, index) as head_input:
            logits = model(input_ids=ids[:, p0:], attention_mask=mask, position_ids=positions[:, p0:],
                           past_key_values=cache, use_cache=True, logits_to_keep=keep).logits  # [1, n, V]
    labels = responses.to(device)[scored.rows, scored.cols][None]  # [1, n]
    log_prob, entropy = logprobs_and_entropy(head_logits(logits, head_input, index), labels, with_entropy,
                                             entropy_grad)  # [1, n] each
    return scored.scatter(log_prob[0], rows, R), (scored.scatter(entropy[0], rows, R) if with_entropy else None)


class PrefixSharing:
    """Whether a worker's forward passes run the micro-batch's shared prompt prefix once, decided per micro-batch.

    Off for a model sharded with FSDP (data-parallel ranks, or CPU offload): FSDP2 frees the gathered weights after
    each forward call, and a backward through two calls (the prefix's, the rows') then finds the first one's gone
    (``setStorage ... out of bounds for storage of size 0``). Off when the model recomputes activations in its
    backward pass (transformers then turns the cache off, which the prefix forward needs), and off for good after
    the model's cache could not be repeated per row."""

    every_token = False  # score every real response token, not only the read ones (scored_tokens.py): benchmarks

    def __init__(self, model: nn.Module, enabled: bool = True):
        self.model = model
        sharded = any(isinstance(p, DTensor) for p in model.parameters())
        self.enabled = enabled and not sharded and not getattr(model, "is_gradient_checkpointing", False)

    def prefix(self, batch: Batch) -> int:
        """The prompt tokens every row of ``batch`` starts with, when worth a second forward call; else 0."""
        p0 = batch_prefix_length(batch) if self.enabled else 0
        return p0 if p0 >= MIN_PREFIX else 0

    def log_probs(self, batch: Batch, device: torch.device, dtype: torch.dtype, with_entropy: bool = False,
                  entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """``model_utils.response_log_probs`` of the micro-batch, its shared prompt prefix run once when there is
        one (the same values to float rounding)."""
        p0 = self.prefix(batch)
        if p0:
            try:
                return shared_prefix_log_probs(self.model, batch, p0, device, dtype, with_entropy, entropy_grad,
                                               self.every_token)
            except (AttributeError, NotImplementedError) as err:  # a cache type without batch_repeat_interleave
                logger.warning("running every row's prompt in full: the model's cache cannot be shared (%s)", err)
                self.enabled = False
        return response_log_probs(self.model, batch, device, dtype, with_entropy, entropy_grad, self.every_token)
