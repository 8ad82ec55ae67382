"""Policy losses beyond PPO's token-level clipped surrogate (``actor.policy_loss.loss_mode``).

``gspo``: Group Sequence Policy Optimization (Zheng et al. 2025). The importance ratio is one number per sequence,
the geometric mean of its token ratios over the policy's own tokens:

    s_i = exp( (1 / |y_i|) * sum_t m_t * (log pi(y_t) - log pi_old(y_t)) ),   |y_i| = sum_t m_t,

with ``m`` the loss mask (inserted retrieval tokens are 0 and count neither in the sum nor in |y_i|). Every token
of sequence i uses s_i, in the token form s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)] (value s_i, gradient
s_i * grad log pi(y_t)), so with one advantage per sequence the gradient is that of the sequence objective
-A_i * s_i / |y_i| per token. Loss per token: max(-A * s, -A * clip(s, 1 - clip_ratio_low, 1 + clip_ratio_high)).
The paper's aggregation is ``loss_agg_mode=seq-mean-token-mean``, and its clip ranges are small (3e-4 / 4e-4):
a sequence ratio moves much less than token ratios. Clip-higher is the asymmetric pair of those keys, as for the
PPO loss. No dual clip (``clip_ratio_c`` is ignored). ``token_weights`` (truncated importance sampling) multiply
the per-token loss, as in the PPO loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from verl.trainer.core_algos import agg_loss, masked_mean
from verl.trainer.registry import register_policy_loss

MAX_LOG_RATIO = 20.0


@register_policy_loss("gspo")
def compute_gspo_loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, mask: Tensor,
                      clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float | None = None,
                      loss_agg_mode: str = "seq-mean-token-mean", global_tokens: float | None = None,
                      global_seqs: float | None = None,
                      token_weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO loss (module docstring). ``old_log_prob``, ``log_prob``, ``advantages``, ``mask``: [B, T].

    Returns the scalar loss and detached metrics: ``pg_clipfrac`` (policy tokens of clipped sequences),
    ``pg_clipfrac_lower`` (0: no dual clip), ``ppo_kl`` (mean of old - new log-prob over the policy tokens) and
    ``seq_ratio_mean`` (mean s_i over non-empty sequences).
    """
    m = mask.to(log_prob.dtype)
    length = m.sum(dim=-1).clamp(min=1.0)  # [B] |y_i|
    seq_log_ratio = ((log_prob - old_log_prob) * m).sum(dim=-1) / length  # [B]
    seq_log_ratio = seq_log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    # value s_i on every token, gradient s_i * grad log pi(y_t)
    log_s = seq_log_ratio.detach()[:, None] + log_prob - log_prob.detach()  # [B, T]
    ratio = torch.exp(log_s)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)  # [B, T]
    if token_weights is not None:
        losses = losses * token_weights
    loss = agg_loss(losses, mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    nonempty = (mask != 0).any(dim=-1)
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask).detach(),
        "pg_clipfrac_lower": torch.zeros((), device=loss.device),
        "ppo_kl": masked_mean(old_log_prob - log_prob, mask).detach(),
        "seq_ratio_mean": masked_mean(torch.exp(seq_log_ratio), nonempty.to(log_prob.dtype)).detach(),
    }
    return loss, metrics
