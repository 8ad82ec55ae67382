"""The actor: the policy's response log-probs and its PPO update.

Choices:

* Log-probs are those of the model's own distribution (logits not divided by the sampling
  temperature): old, new and reference log-probs all use the same definition, so the PPO ratio
  and the KL terms are consistent whatever temperature the rollout sampled at.
* Loss of a micro-batch = the registered policy loss of ``actor.policy_loss.loss_mode`` (``policy_losses``: by
  default PPO's clipped surrogate with low/high and dual clip; ``gspo`` the same on the sequence ratio), given one
  ``PolicyLossInputs`` record (``clip_ratio_low`` / ``clip_ratio_high``, each ``clip_ratio`` when null, the other
  common settings, and the actor keys the loss declared in ``config_args``, checked when the actor starts);
  minus ``entropy_coeff`` x entropy; plus ``kl_loss_coef`` x KL(actor || reference) when ``use_kl_loss`` (GRPO
  style, ``kl_loss_type`` estimator).
  All three aggregate with
  ``loss_agg_mode`` over ``loss_mask`` only, normalised by the mini-batch's global counts
  (``train_utils``). The entropy is computed without gradient when ``entropy_coeff`` is 0.
* **Truncated importance sampling** (``tis_cap``, off by default): each token's policy loss is
  weighted by ``min(pi_old / pi_rollout, tis_cap)`` (detached, ``core_algos.truncated_is_weights``),
  pi_rollout being the engine's log-probs of the sampled tokens (``rollout_log_probs``). Logged:
  ``tis_weight_mean`` and ``tis_capped_frac`` over the policy tokens.
* Mini-batches are consecutive rows in batch order (no shuffling), identical on every run.
* **Shared prompt prefix.** Every forward (the log-prob pass, the update, the LoRA reference) runs the prompt tokens
  a micro-batch's rows all start with once and serves every row from its keys and values
  (``shared_prefix.PrefixSharing``; the same values and gradients to float rounding; not for a model sharded with
  FSDP). A GRPO micro-batch that holds one group shares its whole prompt: on ``make demo-real``'s steps about a
  quarter of the tokens a forward computed.
* **A weight copy in the compute dtype** (``compute_weight_copy``, ``weight_copy.py``): the passes and the update
  run on a copy of the weights in ``fsdp_config.dtype``, their gradients summed into the float32 weights the
  optimiser steps; no cast of every weight in every micro-batch.
* **LoRA** (``model.lora_rank > 0``, ``lora.py``): only the adapters are trained and checkpointed;
  the reference log-probs come from this same model with its adapters disabled
  (``compute_ref_log_prob``), so no second copy of the weights exists.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

from verl.algorithms.core_algos import agg_loss, kl_penalty, masked_mean, rollout_mismatch, truncated_is_weights
from verl.algorithms.registry import POLICY_LOSSES, PolicyLossInputs, policy_loss_config
from verl.config import Config, trajectories_per_step, uses_lora
from verl.protocol import Batch
from verl.workers import weight_copy
from verl.workers.distributed import gather_full_state_dict
from verl.workers.flops import measure_peak_flops
from verl.workers.lora import LoraSpec
from verl.workers.model_utils import DTYPES, load_model, micro_batches, resolve_device
from verl.workers.process_memory import peak_memory_metrics
from verl.workers.shared_prefix import PrefixSharing
from verl.workers.train_utils import (
    GlobalCounts,
    TrainState,
    optimizer_steps_per_training_step,
    token_weight,
)

logger = logging.getLogger(__name__)


class ActorWorker:
    """The trained policy (HF causal LM), one per data-parallel rank."""

    def __init__(self, cfg: Config, total_steps: int):
        self.cfg = cfg
        self.actor_cfg = cfg.actor_rollout_ref.actor
        model_cfg = cfg.actor_rollout_ref.model
        a = self.actor_cfg
        loss = POLICY_LOSSES.get(a.policy_loss.loss_mode)  # policy_losses.compute_policy_loss by default
        self.policy_loss = loss.fn
        self.policy_loss_config = policy_loss_config(loss, a)  # the actor keys it declared, read-only
        self.device = resolve_device(cfg.trainer.device)
        self.dtype = DTYPES[a.fsdp_config.dtype]  # compute dtype (autocast); the weights stay float32
        self.lora = LoraSpec(model_cfg.lora_rank, model_cfg.lora_alpha, tuple(model_cfg.target_modules)) \
            if uses_lora(cfg) else None
        self.model = load_model(AutoModelForCausalLM, model_cfg.path, device=self.device, dtype=torch.float32,
                                seed=cfg.trainer.seed, trainable=True,
                                gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
                                trust_remote_code=model_cfg.trust_remote_code, lora=self.lora,
                                offload=a.fsdp_config.offload)
        steps = total_steps * optimizer_steps_per_training_step(trajectories_per_step(cfg), a.ppo_mini_batch_size,
                                                                a.ppo_epochs)
        self.state = TrainState.from_optim(self.model, a.optim, steps, a.grad_clip, DTYPES[a.optim_state_dtype],
                                           host_memory=cfg.trainer.host_memory)
        self.max_tokens = a.ppo_max_token_len_per_gpu if a.use_dynamic_bsz else None
        # the module the passes run on: the trained one, or its copy in the compute dtype (weight_copy.py)
        self.weight_copy, compute_model = weight_copy.attach(self.model, self.dtype, self.state, a.compute_weight_copy)
        self.prefix_sharing = PrefixSharing(compute_model, a.share_prompt_prefix)

    def compute_log_prob(self, batch: Batch) -> Batch:
        """``old_log_probs`` and ``entropy`` [B, R] of ``responses`` under the current weights (no grad)."""
        log_probs, entropies = [], []
        rows = self.cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
        micros = micro_batches(batch, rows, self.max_tokens)
        with torch.no_grad():
            for micro in micros:
                log_prob, entropy = self.prefix_sharing.log_probs(micro, self.device, self.dtype, with_entropy=True)
                log_probs.append(log_prob.cpu())
                entropies.append(entropy.cpu())
        return Batch({"old_log_probs": micros.in_batch_order(log_probs), "entropy": micros.in_batch_order(entropies)})

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``ref_log_prob`` [B, R] under the base model: the actor with its LoRA adapters disabled (LoRA only;
        without LoRA the reference is its own worker, ``reference.RefWorker``)."""
        if self.lora is None:
            raise RuntimeError("compute_ref_log_prob on the actor needs LoRA (model.lora_rank > 0)")
        rows = self.cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
        micros = micro_batches(batch, rows, self.max_tokens)
        with torch.no_grad(), self.model.disable_adapter():
            log_probs = [self.prefix_sharing.log_probs(micro, self.device, self.dtype)[0].cpu() for micro in micros]
        return Batch({"ref_log_prob": micros.in_batch_order(log_probs)})

    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO epochs x mini-batches x micro-batches over this rank's rows; metrics ``actor/*`` over all ranks.

        Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``loss_mask``,
        ``advantages``, ``old_log_probs`` unless on-policy (and ``ref_log_prob`` with ``use_kl_loss``,
        ``rollout_log_probs`` with ``tis_cap``).
        """
        a = self.actor_cfg
        if a.tis_cap is not None and "rollout_log_probs" not in batch:
            raise ValueError("actor_rollout_ref.actor.tis_cap is set but the batch has no rollout_log_probs: the "
                             "recipe's generation must return the engine's log-probs (SamplingParams.logprobs)")
        metrics = self.state.update(batch, a.ppo_mini_batch_size, a.ppo_epochs,
                                    lambda mini: micro_batches(mini, a.ppo_micro_batch_size_per_gpu, self.max_tokens),
                                    self._micro_batch_loss)
        return {f"actor/{name}": value for name, value in metrics.items()}

    def peak_flops(self, dtypes: list[str]) -> dict[str, float]:
        """This rank's device's dense matmul rate (FLOP/s) in each dtype (``flops.measure_peak_flops``)."""
        return {dtype: measure_peak_flops(self.device, dtype) for dtype in dtypes}

    def peak_memory(self) -> dict[str, float]:
        """This rank's ``perf/max_rss_gb`` and, on a GPU, ``perf/max_memory_allocated_gb`` since the previous call."""
        return peak_memory_metrics(self.device)

    def _micro_batch_loss(self, micro: Batch, counts: GlobalCounts) -> tuple[Tensor, dict[str, float]]:
        a = self.actor_cfg
        to_device = lambda key: micro[key].to(self.device)
        mask = to_device("loss_mask").float()  # [b, R], 1 = sampled by the policy (trained)
        log_prob, entropy = self.prefix_sharing.log_probs(micro, self.device, self.dtype, with_entropy=True,
                                                          entropy_grad=a.entropy_coeff != 0)
        low = a.clip_ratio if a.clip_ratio_low is None else a.clip_ratio_low
        high = a.clip_ratio if a.clip_ratio_high is None else a.clip_ratio_high
        agg = {"mask": mask, "mode": a.loss_agg_mode, "global_tokens": counts.tokens, "global_seqs": counts.seqs}
        # on-policy (no old-log-prob pass, config.recomputes_old_log_probs): this forward runs on the weights that
        # pass would have used, so its detached log-probs are the old ones
        fused = "old_log_probs" not in micro
        old_log_prob = log_prob.detach() if fused else to_device("old_log_probs")
        tis = None if a.tis_cap is None else truncated_is_weights(old_log_prob, to_device("rollout_log_probs"),
                                                                  a.tis_cap)  # [b, R]
        pg_loss, pg_metrics = self.policy_loss(PolicyLossInputs(
            old_log_prob=old_log_prob, log_prob=log_prob, advantages=to_device("advantages"), mask=mask,
            clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=a.clip_ratio_c, loss_agg_mode=a.loss_agg_mode,
            global_tokens=counts.tokens, global_seqs=counts.seqs, token_weights=tis, config=self.policy_loss_config))
        share = token_weight(mask, counts)
        metrics = {"pg_loss": pg_loss.item(), "entropy": masked_mean(entropy, mask).item() * share,
                   **{name: value.item() * share for name, value in pg_metrics.items()}}
        if tis is not None:
            metrics["tis_weight_mean"] = masked_mean(tis, mask).item() * share
            capped = (old_log_prob - to_device("rollout_log_probs")) >= math.log(a.tis_cap)  # [b, R]
            metrics["tis_capped_frac"] = masked_mean(capped.float(), mask).item() * share
        if fused and "rollout_log_probs" in micro:  # rollout/* from this pass, over the tokens the policy sampled
            policy = mask * to_device("info_mask").float()  # [b, R]
            mismatch = rollout_mismatch(old_log_prob, to_device("rollout_log_probs"), policy)
            metrics.update({f"rollout_{name}": value if name.endswith("_max") else value * share
                            for name, value in mismatch.items()})  # *_max: a maximum (train_utils.MAX_SUFFIX)
        loss = pg_loss
        if a.entropy_coeff != 0:
            loss = loss - a.entropy_coeff * agg_loss(entropy, **agg)
        if a.use_kl_loss:
            kl_loss = agg_loss(kl_penalty(log_prob, to_device("ref_log_prob"), a.kl_loss_type), **agg)
            loss = loss + a.kl_loss_coef * kl_loss
            metrics["kl_loss"] = kl_loss.item()
        return loss, metrics

    def full_state_dict(self) -> dict[str, Tensor]:
        """HF-named CPU weights for the rollout engine (complete on rank 0, ``{}`` on other ranks)."""
        return gather_full_state_dict(self.model)

    def save_checkpoint(self, path: str) -> None:
        """Model, optimiser and scheduler under ``path`` (call on every rank)."""
        self.state.save(path)

    def load_checkpoint(self, path: str) -> None:
        """Restore ``save_checkpoint``'s state (call on every rank)."""
        self.state.load(path)
