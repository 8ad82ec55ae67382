"""Overlong trajectories, by ``algorithm.overlong.mode``: the rows the length budget cut (DAPO, Yu et al. 2025:
"Overlong Filtering" and "Soft Overlong Punishment").

A row is *cut* when the recipe's generation says so, in the per-row ``truncated`` column of the generation contract
(the generate phase of ``verl.trainer.columns.STEP``; the search recipe sets it for ``StopReason.MAX_LENGTH``: a
length budget ended the trajectory, ``data.max_trajectory_length`` most often; docs/design.md, "Lengths"). Where
such a row stops is where the budget stopped it, not where the policy chose to, so training on its outcome as if
the policy had ended there teaches the wrong lesson. The trainer step applies the mode right after the reward,
before log-probs, values and advantages (``PPOTrainer.run_step``), so every later phase sees its effect.

* ``none``: cut rows are trained as any other (Search-R1's behaviour).
* ``mask`` (DAPO's overlong filtering; SkyRL's ``apply_overlong_filtering``): the ``loss_mask`` of a cut row is
  zeroed, so it is in no policy loss, entropy or KL term, no value loss, no advantage whitening and no token
  metric. Its score still counts in its group's baseline (GRPO, RLOO): the baseline estimates the expected score
  of the prompt's samples, cut ones included; only the row's own gradient is removed.
* ``soft_penalty`` (DAPO's soft overlong punishment; verl's ``reward_model.overlong_buffer``): with
  L_max = ``data.max_trajectory_length`` and L_cache = ``buffer_len``, a row of |y| response tokens (sampled and
  inserted: the unit of the budget) gets ``penalty_factor * clip(((L_max - L_cache) - |y|) / L_cache, -1, 0)``:
  0 up to L_max - L_cache, then falling linearly to ``-penalty_factor`` at L_max (and beyond). Every row gets it by
  its length, cut or not, as in DAPO; it is added to the outcome score on the token that holds it (the last
  ``loss_mask`` token, ``reward.last_token_index``), in ``token_level_scores``; the per-row ``score`` (the task's,
  e.g. exact match) is left as it was.

Logged every step: ``train/overlong_frac`` (share of the rows that were cut), ``train/overlong_masked`` (number of
rows whose loss mask was zeroed: the cut rows under ``mask``, else 0) and, under ``soft_penalty``,
``train/overlong_penalty`` (mean penalty per row).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from verl.config import OverlongConfig, declared
from verl.protocol import Batch
from verl.trainer import columns
from verl.trainer.reward import last_token_index


def soft_overlong_penalty(lengths: Tensor, max_length: int, buffer_len: int, penalty_factor: float) -> Tensor:
    """DAPO's soft overlong punishment of each row: [B] response lengths (tokens) -> [B] penalties in
    [-penalty_factor, 0] (module docstring)."""
    expected = max_length - buffer_len  # longest response that gets no penalty
    return penalty_factor * torch.clamp((expected - lengths.float()) / buffer_len, min=-1.0, max=0.0)


def mask_rows(loss_mask: Tensor, rows: Tensor) -> Tensor:
    """``loss_mask`` [B, R] with every row where ``rows`` [B] (bool) is True set to 0; other rows unchanged."""
    return loss_mask * (~rows).to(loss_mask.dtype)[:, None]


def apply_overlong(batch: Batch, cfg: OverlongConfig, max_trajectory_length: int) -> tuple[Batch, dict[str, float]]:
    """Apply ``cfg.mode`` to a scored batch (``truncated``, ``loss_mask`` [B, R], ``response_mask`` [B, R],
    ``token_level_scores`` [B, R]) -> the batch with ``loss_mask`` or ``token_level_scores`` replaced (in place: the
    overlong phase of ``verl.trainer.columns``), and the step's ``train/overlong_*`` metrics."""
    cut = torch.as_tensor(np.asarray(columns.require(batch, "overlong")["truncated"], dtype=bool))  # [B]
    metrics = {"train/overlong_frac": float(cut.float().mean()) if len(cut) else 0.0, "train/overlong_masked": 0.0}
    if cfg.mode == "mask":
        columns.write(batch, "overlong", loss_mask=mask_rows(batch["loss_mask"], cut))
        metrics["train/overlong_masked"] = float(cut.sum())
    elif cfg.mode == "soft_penalty":
        lengths = batch["response_mask"].sum(dim=-1)  # [B]
        penalty = soft_overlong_penalty(lengths, max_trajectory_length, cfg.buffer_len, cfg.penalty_factor)  # [B]
        scores = batch["token_level_scores"].clone()  # [B, R]
        scores[torch.arange(len(batch)), last_token_index(batch["loss_mask"])] += penalty.to(scores.dtype)
        columns.write(batch, "overlong", token_level_scores=scores)
        metrics["train/overlong_penalty"] = float(penalty.mean())
    elif cfg.mode != "none":
        modes = ", ".join(declared(OverlongConfig, "mode").allowed_choices())
        raise ValueError(f"unknown algorithm.overlong.mode {cfg.mode!r}: valid are {modes}")
    return batch, metrics
