"""The advantages phase of a step: rewards per token -> ``token_level_rewards``, ``advantages``, ``returns`` [B, R].

KL-in-reward (``algorithm.use_kl_in_reward``), the turn rewards (``algorithm.turn_reward_coef``), then the
estimator registered under ``algorithm.adv_estimator`` (``verl.algorithms.registry``), over ``loss_mask`` and given
what its registration declares it reads. Its columns are the advantages phase of ``verl.trainer.columns``.
"""

from __future__ import annotations

from verl.algorithms import core_algos, turn_credit
from verl.config import Config, adv_estimator
from verl.protocol import Batch
from verl.trainer import columns


def compute_advantages(batch: Batch, cfg: Config, kl_ctrl) -> tuple[Batch, dict[str, float]]:
    """``batch`` with the advantages phase's columns (written in place) and the KL metrics (``kl_ctrl``: the
    adaptive or fixed KL controller, ``core_algos.get_kl_controller``)."""
    algo, metrics = cfg.algorithm, {}
    mask = columns.require(batch, "advantages")["loss_mask"].float()  # [B, R]
    rewards = batch["token_level_scores"]  # [B, R]
    if algo.use_kl_in_reward:
        rewards, metrics = core_algos.apply_kl_penalty(rewards, batch["old_log_probs"], batch["ref_log_prob"], mask,
                                                       kl_ctrl, algo.kl_penalty)
    policy = batch["response_mask"] * batch["info_mask"]  # [B, R] 1 = sampled by the policy: turns are its runs
    turn_scores = batch["turn_scores"] if "turn_scores" in batch else [[]] * len(batch)  # per row, per turn
    if algo.turn_reward_coef:
        rewards = rewards + algo.turn_reward_coef * turn_credit.place_turn_rewards(turn_scores, policy)
    estimator = adv_estimator(cfg)
    turns = turn_credit.turn_index(policy) if estimator.needs_turns else None  # [B, R]
    inputs = core_algos.AdvantageInputs(
        token_level_rewards=rewards, mask=mask,  # [B, R] each
        values=batch["values"] if estimator.needs_critic else None,  # [B, R]
        index=batch["uid"] if estimator.needs_groups else None,  # [B]
        config={name: getattr(algo, name) for name in estimator.config_args},
        turn_scores=turn_credit.scores_tensor(turn_scores, turns) if turns is not None else None,  # [B, K]
        turn_index=turns)
    advantages, returns = estimator.fn(inputs)
    return columns.write(batch, "advantages", token_level_rewards=rewards, advantages=advantages,
                         returns=returns), metrics
