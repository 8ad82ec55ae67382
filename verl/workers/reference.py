"""The reference policy: a frozen copy of the actor's initial weights, for KL terms.

Choices: loaded from ``actor_rollout_ref.model.path`` directly in ``ref.fsdp_config.dtype`` (default:
the actor's training dtype; no optimiser, so no float32 master copy), eval mode, no gradients; sharded
like the actor when distributed (it only saves memory, the log-probs are the same). Micro-batches:
``ref.log_prob_micro_batch_size_per_gpu`` rows, or the actor's token budget when ``actor.use_dynamic_bsz``; the
prompt tokens a micro-batch's rows all start with run once (``shared_prefix.py``).
Log-probs follow the actor's definition (no temperature scaling), so ``ref_log_prob`` and
``old_log_probs`` are comparable.
"""

from __future__ import annotations

import logging

import torch
from transformers import AutoModelForCausalLM

from verl.config import Config
from verl.protocol import Batch
from verl.workers.model_utils import DTYPES, load_model, micro_batches, resolve_device
from verl.workers.shared_prefix import PrefixSharing

logger = logging.getLogger(__name__)


class RefWorker:
    """Frozen reference log-probs, one per data-parallel rank."""

    def __init__(self, cfg: Config, total_steps: int):
        """``total_steps`` is unused (every role shares one constructor signature)."""
        self.cfg = cfg
        model_cfg = cfg.actor_rollout_ref.model
        self.device = resolve_device(cfg.trainer.device)
        self.dtype = DTYPES[cfg.actor_rollout_ref.ref.fsdp_config.dtype]
        self.model = load_model(AutoModelForCausalLM, model_cfg.path, device=self.device, dtype=self.dtype,
                                seed=cfg.trainer.seed, trainable=False, trust_remote_code=model_cfg.trust_remote_code,
                                offload=cfg.actor_rollout_ref.ref.fsdp_config.param_offload)
        actor = cfg.actor_rollout_ref.actor
        self.max_tokens = actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None
        self.prefix_sharing = PrefixSharing(self.model, actor.share_prompt_prefix)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``ref_log_prob`` [B, R] of ``responses`` under the initial weights."""
        rows = self.cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
        micros = micro_batches(batch, rows, self.max_tokens)
        with torch.no_grad():
            log_probs = [self.prefix_sharing.log_probs(micro, self.device, self.dtype)[0].cpu() for micro in micros]
        return Batch({"ref_log_prob": micros.in_batch_order(log_probs)})
