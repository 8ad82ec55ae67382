"""Trajectories cut by the length budget (``algorithm.overlong``): trained as they are, masked out, or penalised.

A row is cut when the generation stopped it for length: its ``stop_reason`` is ``max_length`` (the search recipe
writes it), or, for a recipe that writes no ``stop_reason``, its response fills ``data.max_response_length``.
A cut trajectory did not choose to stop; training it as if it had teaches the policy the ending the budget chose.

- ``none``: trained as generated (Search-R1's behaviour); the fraction is still logged.
- ``mask`` (DAPO's overlong filtering): the cut rows' ``loss_mask`` is zeroed before log-probs, values and
  advantages, so they are in no policy, value or KL loss and add no tokens to the loss denominators. Their score
  still counts in their group's baseline (a group estimator averages every sample of the prompt), as in verl.
- ``soft_penalty`` (DAPO's overlong reward shaping): with L_max = ``data.max_response_length`` and
  L_cache = ``buffer_len``, a response of L tokens (sampled and inserted: both spend the budget) gets
  0 if L <= L_max - L_cache, ``((L_max - L_cache) - L) / L_cache * penalty_factor`` up to L_max (linear from 0 to
  ``-penalty_factor``), added to its token reward on its last policy token. It applies to every row in the
  buffer zone, cut or not, as in DAPO. ``score`` (the task reward, what dynamic sampling filters on) is unchanged.

Metrics: ``train/overlong_frac`` (rows cut), ``train/overlong_masked`` (rows masked), ``train/overlong_penalty_mean``.
"""

from __future__ import annotations

import numpy as np
import torch

from verl.protocol import Batch
from verl.trainer.reward import last_token_index

MODES = ("none", "mask", "soft_penalty")


def cut_rows(batch: Batch, max_response_length: int) -> np.ndarray:
    """``[B]`` bool: the rows the length budget stopped."""
    if "stop_reason" in batch:
        return np.asarray([str(r) == "max_length" for r in batch["stop_reason"]])
    return (batch["response_mask"].sum(dim=-1) >= max_response_length).numpy()


def soft_penalty(lengths: torch.Tensor, max_length: int, buffer_len: int, factor: float) -> torch.Tensor:
    """DAPO's length penalty per row (module docstring): ``[B]`` lengths -> ``[B]`` penalties in [-factor, 0]."""
    start = max_length - buffer_len
    penalty = (start - lengths.float()) / buffer_len * factor
    return torch.where(lengths.float() <= start, torch.zeros_like(penalty), penalty.clamp(min=-factor))


def apply(batch: Batch, mode: str, max_response_length: int, buffer_len: int, factor: float) -> dict[str, float]:
    """Apply ``mode`` to ``batch`` in place (``loss_mask`` or ``token_level_scores``); returns the metrics."""
    cut = cut_rows(batch, max_response_length)
    metrics = {"train/overlong_frac": float(cut.mean()) if len(cut) else 0.0, "train/overlong_masked": 0.0}
    if mode == "mask" and cut.any():
        keep = torch.as_tensor(~cut, dtype=batch["loss_mask"].dtype)[:, None]  # [B, 1]
        batch.tensors["loss_mask"] = batch["loss_mask"] * keep
        metrics["train/overlong_masked"] = float(cut.sum())
    elif mode == "soft_penalty":
        penalty = soft_penalty(batch["response_mask"].sum(dim=-1), max_response_length, buffer_len, factor)  # [B]
        scores = batch["token_level_scores"].clone()
        rows = torch.arange(len(penalty))
        scores[rows, last_token_index(batch["loss_mask"])] += penalty
        batch.tensors["token_level_scores"] = scores
        metrics["train/overlong_penalty_mean"] = float(penalty.mean())
    return metrics
