"""Policy losses, registered by name as values of ``actor_rollout_ref.actor.policy_loss.loss_mode`` (``registry``).

Shapes: B rows, T response tokens. Every loss takes one ``registry.PolicyLossInputs`` record: log-probs of the old
and current policy, advantages and the ``mask`` (1 = a policy token that is trained, 0 = padding or inserted by the
environment), each [B, T]; the clip epsilons; the aggregation (``masked.agg_loss``); optional detached per-token
weights (truncated importance sampling, ``core_algos.truncated_is_weights``); the ``actor.*`` keys it declared (none
for the two here). Each returns the scalar loss and the
same detached metrics: ``pg_clipfrac`` (tokens where the clipped term is active), ``pg_clipfrac_lower`` (tokens bounded
by the dual clip) and ``ppo_kl`` (mean of log pi_old - log pi over the tokens, a k1 estimate of KL(old || new));
gspo adds ``seq_ratio_mean`` (the mean sequence ratio s_i over non-empty rows).

The losses share one clipped surrogate and differ only in the importance ratio it is applied to:

* **vanilla**: PPO (Schulman et al. 2017) with the token ratio r_t = pi(y_t) / pi_old(y_t), separate low/high clip
  epsilons (DAPO "clip-higher", Yu et al. 2025) and dual clip for negative advantages (Ye et al. 2020): the loss of a
  token with A < 0 is bounded by ``-A * c``.
* **gspo**: Group Sequence Policy Optimization (Zheng et al. 2025). The ratio is the sequence's,
  s_i = exp((1/|y_i|) * sum_t (log pi(y_t) - log pi_old(y_t))), the geometric mean of the row's token ratios over
  its counted tokens: |y_i| counts policy tokens only, an inserted retrieval block is neither in the sum nor in the
  length. The gradient comes from the token form s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)] (sg = stop-gradient): its
  value is s_i and its gradient s_i * grad log pi(y_t), so the same surrogate clips whole sequences when the
  advantage is one per row (GRPO) and still accepts a per-token advantage (the paper's GSPO-token). The clip range
  is that of a sequence ratio, so much smaller than PPO's: the paper uses ``clip_ratio_low=3e-4``,
  ``clip_ratio_high=4e-4``. Aggregation: ``seq-mean-token-mean`` is the paper's objective
  (1/G) * sum_i min(s_i A_i, clip(s_i) A_i) and its gradient; ``token-mean`` weighs each sequence's term by
  |y_i| / sum_j |y_j| and ``seq-mean-token-sum`` by |y_i| / G (longer answers count more). Dual clip and TIS
  weights apply as for vanilla; ``clip_ratio_c=null`` gives the paper's loss.

Log-ratios are clamped to [-20, 20] before ``exp`` so a garbage log-prob cannot overflow into a NaN gradient; masked
tokens never contribute and get exactly zero gradient, whatever they hold.
"""

from __future__ import annotations

import torch
from torch import Tensor

from verl.algorithms.masked import agg_loss, mask_count, masked_mean, masked_sum, zero_masked
from verl.algorithms.registry import PolicyLossInputs, register_policy_loss


def _clipped_surrogate(log_ratio: Tensor, inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Per token, with ratio r = exp(log_ratio) and A = ``inputs.advantages``:
        L = max(-A * r, -A * clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)),
        and for A < 0 with dual clip: L = min(L, -A * clip_ratio_c); then L = w * L with ``token_weights`` w;
    aggregated by ``agg_loss``. ``log_ratio`` [B, T] carries the gradient. Returns the loss and the detached
    ``pg_clipfrac`` and ``pg_clipfrac_lower``."""
    advantages, mask, clip_ratio_c = inputs.advantages, inputs.mask, inputs.clip_ratio_c
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (or None to disable dual clip), got {clip_ratio_c}")
    ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))  # [B, T]
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - inputs.clip_ratio_low, 1.0 + inputs.clip_ratio_high)
    pg_losses = torch.maximum(unclipped, clipped)  # [B, T]
    pg_clipfrac = masked_mean((clipped > unclipped).float(), mask)
    if clip_ratio_c is None:
        pg_clipfrac_lower = torch.zeros((), device=pg_losses.device)
    else:
        bound = -advantages * clip_ratio_c
        dual_active = (pg_losses > bound) & (advantages < 0)
        pg_clipfrac_lower = masked_mean(dual_active.float(), mask)
        pg_losses = torch.where(advantages < 0, torch.minimum(pg_losses, bound), pg_losses)
    if inputs.token_weights is not None:
        pg_losses = pg_losses * inputs.token_weights
    loss = agg_loss(pg_losses, mask, inputs.loss_agg_mode, global_tokens=inputs.global_tokens,
                    global_seqs=inputs.global_seqs)
    return loss, {"pg_clipfrac": pg_clipfrac.detach(), "pg_clipfrac_lower": pg_clipfrac_lower.detach()}


@register_policy_loss("vanilla")
def compute_policy_loss(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman 2017) with low/high clip (DAPO) and optional dual clip (Ye 2020), on the token
    ratio r_t = exp(log_prob - old_log_prob).

    Reads every field of ``inputs`` (``clip_ratio_c`` > 1 or None = off; ``token_weights`` None = 1) and no
    ``config`` key. Returns the scalar loss and the detached metrics of the module docstring.
    """
    log_ratio = torch.clamp(inputs.log_prob - inputs.old_log_prob, min=-20.0, max=20.0)  # [B, T]
    loss, metrics = _clipped_surrogate(log_ratio, inputs)
    return loss, {**metrics, "ppo_kl": masked_mean(-log_ratio, inputs.mask).detach()}


def sequence_log_ratio(old_log_prob: Tensor, log_prob: Tensor, mask: Tensor) -> Tensor:
    """GSPO's log s_i = (1/|y_i|) * sum_t (log_prob - old_log_prob) over the row's counted tokens; [B, T] -> [B].
    A row with no counted token gives 0 (ratio 1)."""
    return masked_sum(log_prob - old_log_prob, mask, dim=-1) / mask_count(mask, log_prob, dim=-1).clamp(min=1.0)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): the clipped surrogate on the sequence ratio s_i in its token form
    s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)] (module docstring).

    Reads what ``compute_policy_loss`` reads; the clip epsilons bound the sequence ratio (paper: 3e-4 low, 4e-4
    high), and ``seq-mean-token-mean`` is the paper's aggregation.
    Returns the scalar loss and the detached metrics of the module docstring (``ppo_kl`` from the token ratios).
    """
    old_log_prob, log_prob, mask = inputs.old_log_prob, inputs.log_prob, inputs.mask
    seq_log_ratio = sequence_log_ratio(old_log_prob, log_prob, mask)  # [B]
    counted = zero_masked(log_prob, mask)  # [B, T], exactly 0 on masked tokens: nothing of theirs enters the graph
    log_ratio = seq_log_ratio.detach()[:, None] + counted - counted.detach()  # [B, T], value log s_i
    loss, metrics = _clipped_surrogate(log_ratio, inputs)
    token_log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # [B, T]
    nonempty = (mask != 0).any(dim=-1).to(log_prob.dtype)  # [B]
    seq_ratio = torch.exp(seq_log_ratio.detach().clamp(max=20.0))
    return loss, {**metrics, "ppo_kl": masked_mean(-token_log_ratio, mask).detach(),
                  "seq_ratio_mean": masked_mean(seq_ratio, nonempty)}
