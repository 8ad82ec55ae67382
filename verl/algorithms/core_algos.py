"""The RL algorithms as pure tensor functions: advantages, losses, KL estimators and controllers
(log-probs and entropy from logits are in ``logprobs``).

Shapes: B rows, T response tokens, V vocabulary. Every function takes a ``mask`` [B, T]
(1 = the token counts, 0 = it does not; the trainer passes ``loss_mask = response_mask * info_mask``,
so padding and tokens inserted by the environment are 0) and averages, whitens and accumulates
only over it. Masks may be bool, int or float; masked positions of token-level outputs are 0.
Nothing here knows about Ray, vLLM, FSDP or config objects. Advantage and KL estimators are
registered by name (``registry``): each advantage estimator takes one ``AdvantageInputs`` record and
declares what it reads (critic values, group ids, ``algorithm.*`` values), and the config's choices,
the critic and the trainer's call all come from that declaration. Policy losses are registered the
same way (``actor.policy_loss.loss_mode``: one ``PolicyLossInputs`` record each, ``actor.*`` keys
declared). Split out, and re-exported here so that ``core_algos`` stays the one import: the masked
statistics and loss aggregation (``masked``) and the policy losses (``policy_losses``: PPO's clipped
surrogate ``vanilla``, with clip-higher and dual clip, and GSPO's sequence-level ratio ``gspo``).

Choices and sources:

* **Masked tokens are transparent** (state masking, Search-R1). The GAE and REINFORCE++
  recursions run over the policy tokens of a row only: the "next" value/advantage/return seen at a
  policy token is that of the next *policy* token, so a retrieved block between two turns neither
  breaks the bootstrap chain nor is discounted as if the policy had acted there. A reward that
  sits on a masked token (for example the outcome reward landing on a truncated ``<information>`` block)
  is moved onto the closest policy token before it, so masking never drops reward.
* **Outcome score** for GRPO and RLOO is the row sum of ``token_level_rewards`` (a sequence-level
  quantity, wherever in the row it was written); the mask decides which tokens receive it.
* **GAE** (Schulman et al. 2016): advantages whitened over the batch mask; returns = the
  unwhitened advantages + values (the critic target).
* **GRPO** (Shao et al. 2024, DeepSeekMath): (score - group mean) / (group std + eps), std with
  Bessel's correction; ``norm_adv_by_std_in_grpo=False`` gives the Dr. GRPO advantage (Liu et al. 2025):
  score - group mean. Groups are rows with equal ``index`` (uid strings), never positions. A
  group of one sample has no baseline: its advantage is its raw score (mean 0, std 1).
* **RLOO** (Ahmadian et al. 2024): score minus the mean score of the *other* samples of the
  group; a group of one keeps its raw score.
* **REINFORCE++** (Hu 2025): discounted returns-to-go of the (KL-penalised) token rewards,
  whitened over the batch mask, no critic.
* **Truncated importance sampling** (TIS; Yao et al. 2025, "Your efficient RL framework secretly
  brings you off-policy RL training", as in verl and SkyRL): the rollout engine samples from
  pi_rollout, which differs from the trainer's pi_old (kernels, dtype); each token's policy loss is
  weighted by ``min(pi_old / pi_rollout, C)``, detached. The same log-prob pair gives the mismatch
  metrics (mean and max |log pi_old - log pi_rollout|, k3 KL(pi_rollout || pi_old)).
* **KL estimators** of KL(pi || ref) from samples of pi (Schulman 2020, "Approximating KL
  divergence"): k1 ``kl`` = log pi - log ref; ``abs`` = |k1|; k2 ``mse`` = 0.5 * k1^2;
  k3 ``low_var_kl`` = r - 1 - log r with r = ref / pi (unbiased, >= 0), clamped to [-10, 10].
* **KL controllers**: fixed beta, or the adaptive proportional controller of Ziegler et al.
  2019 (error clipped to [-0.2, 0.2]); the controlled quantity is the mean over sequences of
  the per-sequence KL (the sum of token KLs of a sequence, the KL of the sequence distribution).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from torch import Tensor

# Masked statistics and aggregation (``masked``) and the policy losses (``policy_losses``), re-exported so that
# ``core_algos`` stays the one import for the algorithms.
from verl.algorithms.masked import AGG_MODES as AGG_MODES
from verl.algorithms.masked import agg_loss as agg_loss
from verl.algorithms.masked import masked_mean as masked_mean
from verl.algorithms.masked import masked_sum as masked_sum
from verl.algorithms.masked import masked_var as masked_var
from verl.algorithms.masked import masked_whiten as masked_whiten
from verl.algorithms.masked import zero_masked
from verl.algorithms.policy_losses import compute_policy_loss as compute_policy_loss
from verl.algorithms.policy_losses import compute_policy_loss_gspo as compute_policy_loss_gspo

# The registries (``registry``), re-exported: importing this module registers the built-ins below and, through
# ``policy_losses``, the policy losses.
from verl.algorithms.registry import ADV_ESTIMATORS as ADV_ESTIMATORS
from verl.algorithms.registry import KL_ESTIMATORS as KL_ESTIMATORS
from verl.algorithms.registry import POLICY_LOSSES as POLICY_LOSSES
from verl.algorithms.registry import AdvantageInputs as AdvantageInputs
from verl.algorithms.registry import PolicyLossInputs as PolicyLossInputs
from verl.algorithms.registry import register_adv_estimator as register_adv_estimator
from verl.algorithms.registry import register_kl_estimator as register_kl_estimator
from verl.algorithms.registry import register_policy_loss as register_policy_loss

logger = logging.getLogger(__name__)

KL_CONTROLLERS = ("fixed", "adaptive")  # algorithm.kl_ctrl.type, see ``get_kl_controller``


# ----------------------------------------------------------------------------------------------
# Advantage estimators
# ----------------------------------------------------------------------------------------------


def _fold_masked_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Move each reward sitting on a masked token onto the closest policy token before it.

    Args: rewards [B, T]; mask [B, T]. Returns [B, T], 0 at masked positions. Rewards before a
    row's first policy token have no policy token to go to and are dropped.
    """
    keep = mask != 0  # [B, T]
    cols = torch.arange(rewards.shape[1], device=rewards.device).expand_as(keep)  # [B, T]
    prev_policy = torch.cummax(torch.where(keep, cols, -1), dim=1).values  # [B, T], -1 = none yet
    has_prev = prev_policy >= 0
    folded = torch.zeros_like(rewards)
    folded.scatter_add_(1, prev_policy.clamp(min=0), torch.where(has_prev, rewards, torch.zeros_like(rewards)))
    return zero_masked(folded, mask)


def _masked_gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """Unwhitened GAE over the policy tokens of each row; masked tokens are skipped.

    At a policy token t with n(t) the next policy token of the row (none = end of episode):
    delta_t = r_t + gamma * V_n(t) - V_t and A_t = delta_t + gamma * lam * A_n(t).
    With values = 0 and lam = 1 this is the discounted return-to-go.

    Args: rewards, values, mask: [B, T] (rewards already folded). Returns A [B, T], 0 where masked.
    """
    keep = mask != 0  # [B, T]
    next_value = torch.zeros_like(rewards[:, 0])  # [B]
    next_adv = torch.zeros_like(rewards[:, 0])  # [B]
    zero = torch.zeros_like(next_adv)
    advantages = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages.append(torch.where(keep[:, t], adv, zero))
        next_value = torch.where(keep[:, t], values[:, t], next_value)
        next_adv = torch.where(keep[:, t], adv, next_adv)
    return torch.stack(advantages[::-1], dim=1)  # [B, T]


@register_adv_estimator("gae", needs_critic=True, config_args=("gamma", "lam"), returns_per_row=True)
@torch.no_grad()
def compute_gae_advantage_return(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2016) over the policy tokens only (masked tokens are transparent).

    Reads ``token_level_rewards`` [B, T] (outcome score on the last token, minus KL if in reward),
    ``values`` [B, T] (critic values of the old policy), ``mask`` [B, T] and ``config`` gamma
    (discount) and lam (GAE lambda).
    Returns advantages [B, T] whitened over the mask, and returns [B, T] = unwhitened advantages +
    values (the critic targets); both 0 at masked positions.
    """
    mask, values = inputs.mask, inputs.values
    rewards = _fold_masked_rewards(inputs.token_level_rewards, mask)
    advantages = _masked_gae(rewards, values, mask, inputs.config["gamma"], inputs.config["lam"])
    returns = zero_masked(advantages + values, mask)
    return masked_whiten(advantages, mask), returns


def group_ids(index: np.ndarray, rows: int, device: torch.device) -> Tensor:
    """Dense group id per row ([B] long) from the per-row uids; rows with equal uid share a group."""
    index = np.asarray(index)
    if index.shape != (rows,):
        raise ValueError(f"index must hold one uid per row: got shape {index.shape} for {rows} rows")
    _, inverse = np.unique(index, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)


def group_stats(scores: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row statistics of the row's group: (size, sum, mean, unbiased std), each [B].

    A group of one has std 0 (Bessel divisor clamped to 1).
    """
    n_groups = int(group.max()) + 1 if group.numel() else 0
    size = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, group, torch.ones_like(scores))
    total = torch.zeros_like(size).index_add_(0, group, scores)
    mean = total / size
    sq_dev = torch.zeros_like(size).index_add_(0, group, (scores - mean[group]) ** 2)
    std = (sq_dev / (size - 1.0).clamp(min=1.0)).sqrt()
    return size[group], total[group], mean[group], std[group]


@register_adv_estimator("grpo", needs_groups=True, config_args=("norm_adv_by_std_in_grpo",))
@torch.no_grad()
def compute_grpo_outcome_advantage(inputs: AdvantageInputs, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantage (Shao et al. 2024); Dr. GRPO when ``norm_adv_by_std_in_grpo`` is False.

    Reads ``token_level_rewards`` [B, T] (the row sum is the sequence score), ``mask`` [B, T],
    ``index`` [B] (rows with equal uid form a group, wherever they are) and ``config``
    norm_adv_by_std_in_grpo (divide the centred score by the group std + ``eps``).
    Returns (advantages, advantages), each [B, T]: the row's advantage on every masked-in token.
    """
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1)  # [B]
    size, _, mean, std = group_stats(scores, group_ids(inputs.index, scores.shape[0], scores.device))
    single = size < 2  # no baseline for a group of one: keep the raw score
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores - mean
    if inputs.config["norm_adv_by_std_in_grpo"]:
        adv = adv / (std + eps)
    advantages = zero_masked(adv[:, None].expand_as(rewards), inputs.mask)  # [B, T]
    return advantages, advantages


@register_adv_estimator("rloo", needs_groups=True)
@torch.no_grad()
def compute_rloo_outcome_advantage(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): score minus the mean score of the other rows of its group.

    Reads ``token_level_rewards`` [B, T] (row sum = score), ``mask`` [B, T] and ``index`` [B] uids.
    Returns (advantages, advantages), each [B, T]; a group of one keeps its raw score.
    """
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1)  # [B]
    size, total, _, _ = group_stats(scores, group_ids(inputs.index, scores.shape[0], scores.device))
    baseline = torch.where(size > 1, (total - scores) / (size - 1.0).clamp(min=1.0), torch.zeros_like(scores))
    advantages = zero_masked((scores - baseline)[:, None].expand_as(rewards), inputs.mask)  # [B, T]
    return advantages, advantages


@register_adv_estimator("reinforce_plus_plus", config_args=("gamma",))
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): discounted returns-to-go over the policy tokens, whitened over the mask.

    Reads ``token_level_rewards`` [B, T] (with the KL penalty already in), ``mask`` [B, T] and ``config``
    gamma (discount).
    Returns (advantages [B, T] whitened, returns [B, T] unwhitened), 0 at masked positions.
    """
    mask = inputs.mask
    rewards = _fold_masked_rewards(inputs.token_level_rewards, mask)
    returns = _masked_gae(rewards, torch.zeros_like(rewards), mask, inputs.config["gamma"], lam=1.0)
    return masked_whiten(returns, mask), returns


# ----------------------------------------------------------------------------------------------
# Losses (the policy losses are in ``policy_losses``)
# ----------------------------------------------------------------------------------------------


def truncated_is_weights(old_log_prob: Tensor, rollout_log_prob: Tensor, cap: float) -> Tensor:
    """TIS weights ``min(pi_old / pi_rollout, cap)`` per token, detached; [B, T] -> [B, T].

    The log-ratio is capped at log(cap) before ``exp``, so no weight overflows. Mask them with the loss.
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    log_ratio = torch.clamp(old_log_prob - rollout_log_prob, max=math.log(cap))  # [B, T]
    return torch.exp(log_ratio).detach()


def rollout_mismatch(old_log_prob: Tensor, rollout_log_prob: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the trainer's, over the ``mask``ed tokens [B, T].

    Returns ``logprob_diff_mean`` and ``logprob_diff_max`` (of |log pi_old - log pi_rollout|) and
    ``kl_k3``: the k3 estimate of KL(pi_rollout || pi_old) from the engine's samples (r - 1 - log r,
    r = pi_old / pi_rollout). An empty mask gives zeros.
    """
    abs_diff = (old_log_prob - rollout_log_prob).abs().float()  # [B, T]
    counted = mask != 0
    k3 = kl_penalty(rollout_log_prob.double(), old_log_prob.double(), "low_var_kl")  # [B, T], in float64
    return {"logprob_diff_mean": float(masked_mean(abs_diff, mask)),
            "logprob_diff_max": float(abs_diff[counted].max()) if counted.any() else 0.0,
            "kl_k3": float(masked_mean(k3, mask))}


def compute_value_loss(vpreds: Tensor, values_old: Tensor, returns: Tensor, mask: Tensor, cliprange_value: float,
                       loss_agg_mode: str = "token-mean", global_tokens: float | None = None,
                       global_seqs: float | None = None) -> tuple[Tensor, Tensor]:
    """Clipped value loss (PPO): 0.5 * agg(max((v - R)^2, (v_clip - R)^2)).

    ``v_clip = values_old + clip(vpreds - values_old, -cliprange_value, cliprange_value)``.

    Args: vpreds, values_old, returns, mask: [B, T]; aggregation as in ``agg_loss``.
    Returns (loss scalar, clipfrac: detached masked fraction of tokens where the clipped error is larger).
    """
    vpred_clipped = values_old + torch.clamp(vpreds - values_old, -cliprange_value, cliprange_value)
    err_unclipped = (vpreds - returns) ** 2  # [B, T]
    err_clipped = (vpred_clipped - returns) ** 2  # [B, T]
    loss_mat = torch.maximum(err_unclipped, err_clipped)
    loss = 0.5 * agg_loss(loss_mat, mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    clipfrac = masked_mean((err_clipped > err_unclipped).float(), mask).detach()
    return loss, clipfrac


@register_kl_estimator("kl")
def kl_k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k1 = log pi - log ref (unbiased, any sign); [B, T] -> [B, T]."""
    return log_prob - ref_log_prob


@register_kl_estimator("abs")
def kl_abs(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """|k1|; [B, T] -> [B, T]."""
    return (log_prob - ref_log_prob).abs()


@register_kl_estimator("mse")
def kl_k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k2 = 0.5 * k1^2 (biased, >= 0); [B, T] -> [B, T]."""
    return 0.5 * (log_prob - ref_log_prob).square()


@register_kl_estimator("low_var_kl")
def kl_k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k3 = r - 1 - log r with r = ref / pi (unbiased, >= 0); log r clamped to [-20, 20] before exp and the result
    to [-10, 10]; [B, T] -> [B, T]."""
    log_r = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_r) - 1.0 - log_r, min=-10.0, max=10.0)


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled by pi; [B, T], not masked.

    ``kind`` names a registered KL estimator (Schulman 2020): ``kl`` k1, ``abs`` |k1|, ``mse`` k2,
    ``low_var_kl`` k3; an unknown kind lists the valid ones. Mask it (``agg_loss``/``masked_*``) to use it.
    """
    return KL_ESTIMATORS.get(kind)(log_prob, ref_log_prob)


# ----------------------------------------------------------------------------------------------
# KL controllers and the in-reward KL penalty
# ----------------------------------------------------------------------------------------------


class FixedKLController:
    """A constant KL coefficient beta."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: beta stays fixed."""


class AdaptiveKLController:
    """Proportional controller of Ziegler et al. 2019 driving the observed KL towards ``target_kl``.

    beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL controller needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Raise beta when ``current_kl`` is above target, lower it when below; n_steps = samples seen."""
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(kind: str, kl_coef: float, target_kl: float,
                      horizon: int) -> FixedKLController | AdaptiveKLController:
    """``fixed`` -> FixedKLController(kl_coef); ``adaptive`` -> AdaptiveKLController(kl_coef, target_kl, horizon)."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kind!r}: valid are {', '.join(KL_CONTROLLERS)}")


@torch.no_grad()
def apply_kl_penalty(token_level_scores: Tensor, log_prob: Tensor, ref_log_prob: Tensor, mask: Tensor,
                     kl_ctrl: FixedKLController | AdaptiveKLController,
                     kind: str) -> tuple[Tensor, dict[str, float]]:
    """Token rewards = scores - beta * KL * mask, then update the controller.

    Args:
        token_level_scores, log_prob, ref_log_prob, mask: [B, T].
        kl_ctrl: supplies beta (``value``); updated with the batch's mean per-sequence KL (the sum of
            the masked token KLs of a row, averaged over non-empty rows) and n_steps = B.
        kind: KL estimator, see ``kl_penalty``.
    Returns token_level_rewards [B, T] and metrics ``actor/reward_kl_penalty`` (that mean
    per-sequence KL) and ``actor/reward_kl_penalty_coeff`` (the beta used).
    """
    kld = zero_masked(kl_penalty(log_prob, ref_log_prob, kind), mask)  # [B, T]
    beta = kl_ctrl.value
    rewards = token_level_scores - beta * kld
    seq_kl = kld.sum(dim=-1)  # [B]
    current_kl = float(masked_mean(seq_kl, (mask != 0).any(dim=-1)))
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
