"""The RL algorithms as pure tensor functions: advantages, losses, KL estimators and controllers.

Shapes: B rows, T response tokens, V vocabulary. Every function takes a ``mask`` [B, T]
(1 = the token counts, 0 = it does not; the trainer passes ``loss_mask = response_mask * info_mask``,
so padding and tokens inserted by the environment are 0) and averages, whitens and accumulates
only over it. Masks may be bool, int or float; masked positions of token-level outputs are 0.
Nothing here knows about Ray, vLLM, FSDP or config objects.

Choices and sources:

* **Masked tokens are transparent** (state masking, Search-R1). The GAE and REINFORCE++
  recursions run over the policy tokens of a row only: the "next" value/advantage/return seen at a
  policy token is that of the next *policy* token, so a retrieved block between two turns neither
  breaks the bootstrap chain nor is discounted as if the policy had acted there. A reward that
  sits on a masked token (e.g. the outcome reward landing on a truncated ``<information>`` block)
  is moved onto the closest policy token before it, so masking never drops reward.
* **Outcome score** for GRPO and RLOO is the row sum of ``token_level_rewards`` (a sequence-level
  quantity, wherever in the row it was written); the mask decides which tokens receive it.
* **GAE** (Schulman et al. 2016): advantages whitened over the batch mask; returns = the
  unwhitened advantages + values (the critic target).
* **GRPO** (Shao et al. 2024, DeepSeekMath): (score - group mean) / (group std + eps), std with
  Bessel's correction; ``norm_adv_by_std=False`` gives the Dr. GRPO advantage (Liu et al. 2025):
  score - group mean. Groups are rows with equal ``index`` (uid strings), never positions. A
  group of one sample has no baseline: its advantage is its raw score (mean 0, std 1).
* **RLOO** (Ahmadian et al. 2024): score minus the mean score of the *other* samples of the
  group; a group of one keeps its raw score.
* **REINFORCE++** (Hu 2025): discounted returns-to-go of the (KL-penalised) token rewards,
  whitened over the batch mask, no critic.
* **PPO** clipped surrogate (Schulman et al. 2017) with separate low/high clip epsilons (DAPO
  "clip-higher", Yu et al. 2025) and dual clip for negative advantages (Ye et al. 2020): the loss
  of a token with A < 0 is bounded by ``-A * c``. The log-ratio is clamped to [-20, 20] before
  ``exp`` so a masked garbage log-prob cannot overflow into a NaN gradient.
* **Loss aggregation**: ``token-mean`` (DAPO: every counted token weighs the same),
  ``seq-mean-token-sum`` (Dr. GRPO: per-sequence sums averaged over sequences) and
  ``seq-mean-token-mean`` (original GRPO). ``global_tokens`` / ``global_seqs`` replace this
  micro-batch's own counts, so summing micro-batch losses (gradient accumulation, data-parallel
  all-reduce of gradients) reproduces the full-batch loss exactly.
* **KL estimators** of KL(pi || ref) from samples of pi (Schulman 2020, "Approximating KL
  divergence"): k1 ``kl`` = log pi - log ref; ``abs`` = |k1|; k2 ``mse`` = 0.5 * k1^2;
  k3 ``low_var_kl`` = r - 1 - log r with r = ref / pi (unbiased, >= 0), clamped to [-10, 10].
* **KL controllers**: fixed beta, or the adaptive proportional controller of Ziegler et al.
  2019 (error clipped to [-0.2, 0.2]); the controlled quantity is the mean over sequences of
  the per-sequence KL (the sum of token KLs of a sequence, the KL of the sequence distribution).
* **Log-probs** as ``gather(logits) - logsumexp(logits)``: no [B, T, V] log-softmax output is
  kept for backward (half-precision logits are upcast one row at a time).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

logger = logging.getLogger(__name__)

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_KINDS = ("kl", "abs", "mse", "low_var_kl")


# ----------------------------------------------------------------------------------------------
# Masked statistics
# ----------------------------------------------------------------------------------------------


