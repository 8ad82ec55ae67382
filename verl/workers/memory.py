"""The expected memory of a run per device, from the model config and the settings, printed at start-up.

An estimate to catch a run that cannot fit before minutes of loading, not a measurement. Per
device (one rank; ``W`` ranks, ``P`` parameters of the policy, ``Pt`` of them trained, ``T``
tokens of a row = max prompt + max response, ``b`` rows of a training micro-batch):

* **weights**: the actor's float32 master weights, sharded ``4P / W`` (on the host with
  ``actor.fsdp_config.*_offload``); the reference model in ``ref.fsdp_config.dtype``, sharded (none under LoRA:
  it is the actor with adapters disabled); the critic's float32 weights (GAE only); the rollout engine's
  full copy in ``rollout.dtype``, ``P x bytes / tp``.
* **optimiser**: AdamW's two moments, ``8 Pt / W`` (``4 Pt / W`` with ``optim_state_dtype:
  bfloat16``), plus float32 gradients ``4 Pt / W``; the critic's likewise (on the host with offload).
* **activations** of one micro-batch: ``b T h L`` x 34 bytes at 2-byte precision without gradient
  checkpointing (Korthikanti et al. 2022, "Reducing Activation Recomputation", attention scores
  left out: PyTorch's SDPA does not keep them), x 2 with it (each layer's input) plus one layer's
  full set; twice that in float32 (the actor's training dtype, ``actor.fsdp_config.dtype``). Plus the
  logits ``b R V`` once (log-probs and entropy are
  chunked, ``verl.algorithms.logprobs``), plus one FSDP-gathered layer.
* **KV cache**: HF ``generate`` holds ``rows x T x L x 2 x kv_heads x head_dim`` values for a
  micro-batch of ``rollout.micro_batch_size`` rows in ``rollout.dtype``; vLLM takes ``gpu_memory_utilization`` of the
  device (GPU) or ``cpu_kv_cache_gb`` (CPU).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from verl.config import Config, max_sequence_length, uses_critic, uses_lora, uses_reference, world_size
from verl.workers.model_utils import DTYPES, GRADIENT_CHECKPOINTING_ABOVE

logger = logging.getLogger(__name__)

GIB = 1 << 30


@dataclass
class MemoryEstimate:
    """Bytes per device by component; ``host`` holds what offload moves off the device."""

    weights: float
    optimizer: float
    activations: float
    kv_cache: float
    host: float
    params: int  # of the policy
    trainable: int  # of the policy (all, or the LoRA adapters)

    @property
    def device_total(self) -> float:
        return self.weights + self.optimizer + self.activations + self.kv_cache

    def table(self) -> str:
        rows = [("weights", self.weights), ("optimizer + gradients", self.optimizer),
                ("activations + logits", self.activations), ("rollout KV cache", self.kv_cache),
                ("total per device", self.device_total), ("offloaded to host", self.host)]
        head = (f"expected memory per device (policy {self.params / 1e9:.2f}B parameters, "
                f"{self.trainable / 1e6:.1f}M trained)")
        return "\n".join([head] + [f"  {name:<24}{value / GIB:9.2f} GiB" for name, value in rows])


def count_parameters(cfg: Config) -> tuple[int, int, nn.Module]:
    """(all, trained) parameters of the policy, from its config on the meta device (no weights read)."""
    model_cfg = cfg.actor_rollout_ref.model
    hf_config = AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=model_cfg.trust_remote_code)
    total = sum(p.numel() for p in model.parameters())
    if not uses_lora(cfg):
        return total, total, model
    targets = set(model_cfg.target_modules)
    adapters = sum(model_cfg.lora_rank * (m.in_features + m.out_features) for name, m in model.named_modules()
                   if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets)
    return total + adapters, adapters, model


def estimate_memory(cfg: Config) -> MemoryEstimate:
    """The estimate of the module docstring for ``cfg``."""
    total, trained, model = count_parameters(cfg)
    hf = model.config
    world = world_size(cfg)
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    engine = DTYPES[rollout.dtype].itemsize  # bytes per value in the rollout engine
    compute = DTYPES[actor.fsdp_config.dtype].itemsize  # bytes per activation value in the actor's training
    ref_bytes = DTYPES[cfg.actor_rollout_ref.ref.fsdp_config.dtype].itemsize
    optim_bytes = 4 if actor.optim_state_dtype == "bfloat16" else 8
    weights = rollout_weights = total * engine / rollout.tensor_model_parallel_size
    actor_weights, actor_optim = 4 * total / world, (optim_bytes + 4) * trained / world
    host = 0.0
    if actor.fsdp_config.offload:
        host, actor_weights, actor_optim = actor_weights + actor_optim, 0.0, 0.0
    weights += actor_weights
    optimizer = actor_optim
    if uses_reference(cfg) and not uses_lora(cfg):
        weights += total * ref_bytes / world
    if uses_critic(cfg):
        weights += 4 * total / world
        optimizer += (8 + 4) * total / world  # the critic trains every weight in float32

    layers, hidden = hf.num_hidden_layers, hf.hidden_size
    tokens = max_sequence_length(cfg.data)
    rows = max(1, actor.ppo_max_token_len_per_gpu // tokens) if actor.use_dynamic_bsz \
        else actor.ppo_micro_batch_size_per_gpu
    checkpointing = cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    if checkpointing is None:
        checkpointing = total > GRADIENT_CHECKPOINTING_ABOVE
    precision = compute / 2  # the 34-byte figure is for 2-byte activations
    per_token_layer = (2 * hidden * layers + 34 * hidden) if checkpointing else 34 * hidden * layers
    activations = rows * tokens * per_token_layer * precision
    activations += rows * cfg.data.max_trajectory_length * hf.vocab_size * compute  # logits, once
    activations += 2 * 4 * total / max(layers, 1)  # one gathered layer and its gradient, float32

    head_dim = getattr(hf, "head_dim", None) or hidden // hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    if rollout.name == "hf":
        kv_cache = rollout.micro_batch_size * tokens * layers * 2 * kv_heads * head_dim * engine
    elif torch.cuda.is_available():
        kv_cache = max(0.0, rollout.gpu_memory_utilization * device_memory() - rollout_weights)
    else:
        kv_cache = rollout.cpu_kv_cache_gb * GIB
    return MemoryEstimate(weights=weights, optimizer=optimizer, activations=activations, kv_cache=kv_cache,
                          host=host, params=total, trainable=trained)


def device_memory() -> float:
    """Bytes of one device: the first GPU's, else this host's RAM."""
    if torch.cuda.is_available():
        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def report_memory(cfg: Config) -> MemoryEstimate:
    """Log the estimate; warn when it exceeds the device (on a CPU host: all ranks of the node together)."""
    estimate = estimate_memory(cfg)
    logger.info("%s", estimate.table())
    on_gpu = torch.cuda.is_available() and cfg.trainer.device != "cpu"
    ranks_sharing = 1 if on_gpu else (cfg.trainer.n_gpus_per_node if cfg.trainer.backend == "ray" else 1)
    need, have = estimate.device_total * ranks_sharing, device_memory()
    if need > have:
        logger.warning("the run may not fit: about %.1f GiB expected per %s, %.1f GiB available; consider "
                       "actor_rollout_ref.model.lora_rank, actor_rollout_ref.actor.fsdp_config.param_offload=true, "
                       "actor_rollout_ref.actor.optim_state_dtype=bfloat16, gradient checkpointing or smaller "
                       "micro-batches", need / GIB, "GPU" if on_gpu else "host", have / GIB)
    return estimate
