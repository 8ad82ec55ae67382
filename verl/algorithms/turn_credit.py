"""Turn-level credit: per-turn scores placed on the tokens of their turn.

A trajectory is a sequence of turns. In the response, turn ``k`` is the ``k``-th maximal run of policy tokens
(``response_mask * info_mask == 1``): every turn but the last is followed by an inserted run (for example an
``<information>`` block or a feedback text), so runs and turns correspond one to one. A reward that scores turns
(a search turn that retrieved evidence, ``retrieval_hit``) hands the trainer one list per row,
``turn_scores[i][k]`` for turn ``k`` of row ``i``; NaN marks a turn the term does not score (``retrieval_hit``: a
turn that did not search), and a shorter list leaves the remaining turns unscored too.

Two uses, both configured in ``algorithm``:
- ``turn_reward_coef`` (any estimator; the PPO case): ``coef * turn_scores[i][k]`` is added to the token reward
  on the LAST policy token of turn ``k`` (nothing for an unscored turn); GAE then carries it back through the
  values. Never on an inserted token: no gradient and no value target exist there.
- ``adv_estimator=grpo_turn``: GRPO's outcome advantage plus ``turn_adv_coef`` times a step advantage. Step
  groups, as in GiGPO (Feng et al. 2025), are the turns of one prompt's samples (same ``uid``) at the same turn
  index; a turn's step advantage is its score minus its step group's mean (divided by the group's std with
  ``norm_adv_by_std_in_grpo``), on every policy token of that turn. Unscored turns are in no step group and get
  no step advantage, so an answering turn is never compared with a searching one; a step group of one gets none
  either (no baseline). GiGPO's other grouping, by identical environment state, is not built: two samples of a search
  agent rarely reach the same state after their first turn.

Shapes: ``B`` rows, ``R`` response tokens; ``turn_index`` ``[B, R]`` long, -1 on tokens that are not the policy's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from verl.algorithms.core_algos import compute_grpo_outcome_advantage, group_ids, group_stats
from verl.algorithms.masked import zero_masked
from verl.algorithms.registry import AdvantageInputs, register_adv_estimator


def turn_index(policy_mask: Tensor) -> Tensor:
    """Per token, the index of the policy turn it belongs to (-1 off policy tokens). ``[B, R] -> [B, R]`` long."""
    policy = policy_mask.bool()
    starts = policy & ~torch.nn.functional.pad(policy[:, :-1], (1, 0), value=False)  # a run begins here
    index = starts.long().cumsum(dim=1) - 1
    return torch.where(policy, index, torch.full_like(index, -1))


def last_tokens(turns: Tensor) -> Tensor:
    """``[B, R]`` bool: the last policy token of each turn (the next token is in another turn or is not policy)."""
    following = torch.nn.functional.pad(turns[:, 1:], (0, 1), value=-1)
    return (turns >= 0) & (following != turns)


def scores_tensor(turn_scores: Sequence[Sequence[float]], turns: Tensor) -> Tensor:
    """``[B, K]`` float: row ``i``'s turn scores padded with NaN (unscored) to ``K`` = the most turns of any row
    (extra scores beyond a row's turns are an error: they would land on no token)."""
    n_turns = (turns.max(dim=1).values + 1).tolist()  # [B]
    K = max(n_turns, default=0)
    out = torch.full((turns.shape[0], max(K, 1)), float("nan"), dtype=torch.float32)
    for i, row in enumerate(turn_scores):
        if len(row) > n_turns[i]:
            raise ValueError(f"row {i}: {len(row)} turn scores for {n_turns[i]} policy turns")
        if len(row):
            out[i, :len(row)] = torch.as_tensor(np.asarray(row, dtype=np.float32))
    return out


def place_turn_rewards(turn_scores: Sequence[Sequence[float]], policy_mask: Tensor) -> Tensor:
    """``[B, R]``: each scored turn's score on the last policy token of that turn, 0 elsewhere."""
    turns = turn_index(policy_mask)
    per_turn = torch.nan_to_num(scores_tensor(turn_scores, turns), nan=0.0)  # [B, K], unscored turns add nothing
    gathered = per_turn.gather(1, turns.clamp(min=0))  # [B, R]: the score of the token's turn
    return torch.where(last_tokens(turns), gathered, torch.zeros_like(gathered))


@register_adv_estimator("grpo_turn", needs_groups=True, needs_turns=True,
                        config_args=("norm_adv_by_std_in_grpo", "turn_adv_coef"))
@torch.no_grad()
def compute_grpo_turn_advantage(inputs: AdvantageInputs, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantage + ``turn_adv_coef`` x step advantage over step groups (module docstring).

    Reads ``token_level_rewards``, ``mask``, ``index`` (uid) as GRPO does, and ``turn_scores`` [B, K] with
    ``turn_index`` [B, T]. Returns (advantages, advantages), each [B, T].
    """
    outcome, _ = compute_grpo_outcome_advantage(inputs, eps)
    turns, scores = inputs.turn_index, inputs.turn_scores  # [B, T] long, [B, K]
    B, K = scores.shape
    n_turns = (turns.max(dim=1).values + 1).clamp(max=K)  # [B]
    has_turn = (torch.arange(K)[None, :] < n_turns[:, None]) & scores.isfinite()  # [B, K]: row i has a scored turn k
    group = group_ids(inputs.index, B, scores.device)  # [B]
    step_group = (group[:, None] * K + torch.arange(K)[None, :])[has_turn]  # [N] one id per (prompt, turn index)
    flat = scores[has_turn]  # [N]
    step_adv = torch.zeros((B, K), dtype=torch.float32)
    if flat.numel():
        _, dense = torch.unique(step_group, return_inverse=True)
        size, _, mean, std = group_stats(flat, dense)
        adv = flat - mean
        if inputs.config["norm_adv_by_std_in_grpo"]:
            adv = adv / (std + eps)
        step_adv[has_turn] = torch.where(size > 1, adv, torch.zeros_like(adv))
    per_token = step_adv.gather(1, turns.clamp(min=0))  # [B, T]: the step advantage of the token's turn
    per_token = torch.where(turns >= 0, per_token, torch.zeros_like(per_token))
    advantages = outcome + inputs.config["turn_adv_coef"] * zero_masked(per_token, inputs.mask)
    return advantages, advantages
