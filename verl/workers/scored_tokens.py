"""The response tokens whose log-probs a pass must compute, and the LM head run on those tokens alone.

Most of a Search-R1 response is text the policy did not write: the retrieved passages (53 % of the response tokens
of ``make demo-real``'s GRPO steps) and the padding up to the micro-batch's longest row. No log-prob there is read:
the policy loss, the KL terms, the entropy (bonus and metric) and the KL-in-reward are taken over ``loss_mask``, the
``rollout/*`` mismatch over the tokens the policy sampled (``response_mask * info_mask``), SFT's loss over
``loss_mask``. So the log-prob pass, the update, the reference and SFT run the LM head, its [n, V] logits and the
log-softmax on the n tokens in either mask only (``ScoredTokens``); the transformer still runs every token (the
passages are the context of what follows). Log-probs and entropy are 0 at the other response tokens, as at padding.
A batch with neither mask (a benchmark's, a test's) scores every real response token.

How the head runs on n tokens: a forward pre-hook on the model's output embeddings (``get_output_embeddings``)
replaces the hidden states [b, t, h] it is given with the scored ones, [1, n, h] (``head_on``). The model's own code
after its head (Gemma's final soft-cap, a logit scale) then runs on those n rows, so each family computes what its
full forward computes there. A model whose forward does not call that module gets its full logits, gathered after.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from verl.protocol import Batch


@dataclass
class ScoredTokens:
    """The scored response tokens of a micro-batch: token k of row ``rows[j]`` is ``cols[j]`` (row-major order)."""

    rows: Tensor  # [n] long
    cols: Tensor  # [n] long, < r (the response columns the pass keeps)
    placeholder: bool = False  # nothing is read: one token computed for the graph, its value scattered as 0

    @classmethod
    def of(cls, batch: Batch, r: int, device: torch.device, every_token: bool = False) -> ScoredTokens:
        """The tokens of the first ``r`` response columns that are real and read (module docstring); every real one
        when the batch has no ``loss_mask`` or ``every_token`` asks. At least one token, so that an update over a
        micro-batch with nothing to train still has a graph (its loss is 0 by the mask)."""
        R = batch["responses"].shape[1]
        scored = batch["attention_mask"][:, -R:][:, :r].bool()  # [b, r], a real response token
        if "loss_mask" in batch and not every_token:
            read = batch["loss_mask"][:, :r].bool()
            if "info_mask" in batch and "response_mask" in batch:  # rollout/*: the tokens the policy sampled
                read = read | (batch["response_mask"][:, :r].bool() & batch["info_mask"][:, :r].bool())
            scored = scored & read
        scored = scored.nonzero()  # [n, 2]
        if len(scored) == 0:
            return cls(torch.zeros(1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device),
                       placeholder=True)
        return cls(scored[:, 0].to(device), scored[:, 1].to(device))

    def scatter(self, values: Tensor, rows: int, R: int) -> Tensor:
        """``values`` [n] at their tokens of a [rows, R] float32 tensor, 0 elsewhere (differentiable in ``values``)."""
        out = values.new_zeros((rows, R), dtype=torch.float32)
        return out.index_put((self.rows, self.cols), values.float() * (0.0 if self.placeholder else 1.0))


class HeadInput:
    """Set by ``head_on``: whether the model's LM head ran on the selected hidden states."""

    ran = False


@contextmanager
def head_on(model: nn.Module, index: Tensor) -> Iterator[HeadInput]:
    """While open, the model's LM head is given rows ``index`` [n] of its flattened input [b * t, h], as [1, n, h]
    (once: a second call would see all of its input). ``.ran`` says whether that happened; when not (no output
    embeddings module, or the forward never called it) the logits are the full [b, t, V]."""
    state = HeadInput()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        yield state
        return

    def select(module: nn.Module, args: tuple) -> tuple | None:
        if state.ran:
            return None
        state.ran = True
        hidden = args[0]  # [b, t, h]
        return (hidden.reshape(-1, hidden.shape[-1])[index][None], *args[1:])  # [1, n, h]

    handle = head.register_forward_pre_hook(select)
    try:
        yield state
    finally:
        handle.remove()


def head_logits(logits: Tensor, state: HeadInput, index: Tensor) -> Tensor:
    """The scored tokens' logits [1, n, V]: the model's output when the head ran on them (``head_on``), else rows
    ``index`` of its full logits [b, t, V]."""
    return logits if state.ran else logits.reshape(-1, logits.shape[-1])[index][None]
