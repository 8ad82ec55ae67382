"""An advantage estimator in one file, plugged in by name: ``plugins=[examples.my_estimator]``.

    python -m verl.trainer.main_ppo plugins=[examples.my_estimator] \\
        algorithm.adv_estimator=reinforce_plus_plus_baseline actor_rollout_ref.rollout.n=4 ...

``plugins`` modules are imported before the config is checked (and in every worker), so the name registered here is
a valid ``algorithm.adv_estimator``; the decorator declares what the estimator needs (groups: the config then
requires ``rollout.n >= 2``; no critic: none is built), and the trainer calls it as it calls the built-ins
(``verl.algorithms.registry``). Nothing under ``verl/`` changes.

The estimator: REINFORCE++ with a group baseline (Hu et al. 2025, "REINFORCE++-baseline"; verl names it
``reinforce_plus_plus_baseline``): a row's outcome score minus the mean score of its prompt's samples, on every
policy token of the row, then whitened over all the batch's policy tokens (not per group, as GRPO divides by a
group's std: a group whose samples all score alike gets advantage 0 either way, and one low-variance group does not
get its small differences blown up).
"""

from __future__ import annotations

import torch
from torch import Tensor

from verl.algorithms.core_algos import group_ids, group_stats, masked_whiten, zero_masked
from verl.algorithms.registry import AdvantageInputs, register_adv_estimator

NAME = "reinforce_plus_plus_baseline"


@register_adv_estimator(NAME, needs_groups=True)
@torch.no_grad()
def reinforce_plus_plus_baseline(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Reads ``token_level_rewards`` [B, T] (the row sum is the score), ``mask`` [B, T] (1 = a trained policy
    token) and ``index`` [B] (rows with equal uid are one prompt's samples). Returns (advantages, advantages),
    each [B, T], 0 off the mask."""
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1)  # [B]
    _, _, mean, _ = group_stats(scores, group_ids(inputs.index, scores.shape[0], scores.device))  # [B]
    centred = zero_masked((scores - mean)[:, None].expand_as(rewards), inputs.mask)  # [B, T]
    advantages = masked_whiten(centred, inputs.mask)  # [B, T]
    return advantages, advantages
