"""The expected memory of a run per device, from the model config and the settings, printed at start-up.

An estimate to catch a run that cannot fit before minutes of loading, not a measurement: at start-up at the lengths
the run's data and environment make (``RowLengths``: the data's longest prompt and the response the recipe expects,
e.g. every turn's sampled tokens plus the blocks the retrieval service really returns), with the bound at the
configured maximum lengths second (a 135M policy's bound was 62.5 GiB under Search-R1's lengths for a measured 9.4
GiB peak: issue 57), and each step at that step's longest row (``perf/memory_estimate_gb``, logged next to the
measured peak; ``MemoryMeter``). Per device (one rank; ``W`` ranks, ``P`` parameters of the policy,
``Pt`` of them trained, ``T`` tokens of a row = max prompt + max response, or the step's longest row, ``b`` rows of
a training micro-batch):

* **weights**: the actor's float32 master weights, sharded ``4P / W`` (on the host with
  ``actor.fsdp_config.*_offload``), and with ``actor.compute_weight_copy`` their copy in the compute dtype; the
  reference model in ``ref.fsdp_config.dtype``, sharded (none under LoRA: it is the actor with adapters disabled);
  the critic's float32 weights (GAE only; with ``critic.compute_weight_copy`` their copy too); the rollout
  engine's full copy in ``rollout.dtype``, ``P x bytes / tp``.
* **optimiser**: AdamW's two moments, ``8 Pt / W`` (``4 Pt / W`` with ``optim_state_dtype:
  bfloat16``), plus float32 gradients ``4 Pt / W``; the critic's likewise (on the host with offload).
* **activations** of one micro-batch: ``b T L`` x (30 ``h`` + 10 ``i``) bytes with 2-byte compute (autocast over
  the float32 weights), x (40 ``h`` + 16 ``i``) in float32 (``h`` hidden, ``i`` MLP intermediate size), without
  gradient checkpointing; with it, ``2 h`` per layer (each layer's input) plus one layer's full set. Measured: the
  tensors autograd saves in a Llama/Qwen2 layer (fp32 RMSNorm inputs, rotary q/k copies, the gated MLP's four
  ``i``-wide tensors, SDPA's output and log-sum-exp; ``ACTIVATION_BYTES``, checked against a live forward by
  ``tests/verl/workers/test_activation_bytes.py``); Korthikanti et al.'s ``34 h`` (GPT with a ``4h`` GeLU MLP)
  is 40-60 % under it for these models. Plus the logits ``b R V`` once (log-probs and entropy are chunked,
  ``verl.algorithms.logprobs``; an upper bound, as the head scores only the tokens a loss or metric reads,
  ``scored_tokens.py``), plus one FSDP-gathered layer. With a critic (GAE), the larger of that and the
  critic's micro-batch (its own rows or token budget, no logits): the two never run at once.
* **KV cache**: the HF engine holds ``rows x T x L x 2 x kv_heads x head_dim`` values for a
  micro-batch of ``rollout.micro_batch_size`` rows (at most the rows one engine gets in a step) in
  ``rollout.dtype``; its static cache (on a GPU) pads the rows to a power of two and ``T`` to a multiple of 256,
  and is kept between calls (docs/design.md, "The HF engine's decode loop"); vLLM takes
  ``gpu_memory_utilization`` of the device (GPU) or ``cpu_kv_cache_gb`` (CPU).
* **the process itself** on a CPU host (where device memory is the host's): its resident set before any model is
  loaded (Python, torch, the tokenizer and the data), since a rank's peak RSS includes it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from verl.config import (
    Config,
    max_sequence_length,
    rollout_world_size,
    trajectories_per_step,
    uses_critic,
    uses_lora,
    uses_reference,
    world_size,
)
from verl.workers.critic import critic_token_budget
from verl.workers.device_holders import report_other_holders
from verl.workers.model_utils import DTYPES, GRADIENT_CHECKPOINTING_ABOVE
from verl.workers.process_memory import host_total_bytes
from verl.workers.rollout.hf_decode import LENGTH_QUANTUM

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
    runtime: float = 0.0  # on a CPU host: what the process held before any model (Python, torch, data)

    @property
    def device_total(self) -> float:
        return self.weights + self.optimizer + self.activations + self.kv_cache + self.runtime

    def table(self) -> str:
        rows = [("weights", self.weights), ("optimizer + gradients", self.optimizer),
                ("activations + logits", self.activations), ("rollout KV cache", self.kv_cache),
                ("process before models", self.runtime), ("total per device", self.device_total),
                ("offloaded to host", self.host)]
        head = (f"expected memory per device (policy {self.params / 1e9:.2f}B parameters, "
                f"{self.trainable / 1e6:.1f}M trained)")
        return "\n".join([head] + [f"  {name:<24}{value / GIB:9.2f} GiB" for name, value in rows])


@dataclass(frozen=True)
class RowLengths:
    """The longest row a run expects at start-up: its prompt and response tokens, and where they come from (words for
    the start-up message)."""

    prompt: int
    response: int
    source: str


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


# Bytes autograd keeps per token and decoder layer, as (x hidden, x intermediate), by compute width in bytes:
# measured on SmolLM2-135M (h 576, i 1536) and Qwen2.5-0.5B (h 896, i 4864) layers (module docstring).
ACTIVATION_BYTES = {2: (30, 10), 4: (40, 16)}


def activation_bytes(hidden: int, intermediate: int, compute_bytes: int) -> float:
    """Bytes one decoder layer keeps for the backward per token (``ACTIVATION_BYTES``)."""
    per_hidden, per_intermediate = ACTIVATION_BYTES[2 if compute_bytes <= 2 else 4]
    return per_hidden * hidden + per_intermediate * intermediate


def estimate_memory(cfg: Config, tokens: int | None = None, response_tokens: int | None = None,
                    counted: tuple[int, int, nn.Module] | None = None) -> MemoryEstimate:
    """The estimate of the module docstring for ``cfg``: at the configured maximum lengths (a row of
    ``max_sequence_length`` tokens, ``data.max_trajectory_length`` of them response), or at the given ``tokens`` per
    row and ``response_tokens`` (a step's longest row: ``perf/memory_estimate_gb``). ``counted``: a previous
    ``count_parameters(cfg)``, to skip building the meta model again."""
    total, trained, model = counted or count_parameters(cfg)
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
    if actor.compute_weight_copy:  # the weights again in the compute dtype (weight_copy.py)
        weights += compute * total / world
    optimizer = actor_optim
    if uses_reference(cfg) and not uses_lora(cfg):
        weights += total * ref_bytes / world
    if uses_critic(cfg):
        weights += 4 * total / world
        if cfg.critic.compute_weight_copy:  # the critic's weights again in its compute dtype (weight_copy.py)
            weights += DTYPES[cfg.critic.model.fsdp_config.dtype].itemsize * total / world
        optimizer += (8 + 4) * total / world  # the critic trains every weight in float32

    layers, hidden = hf.num_hidden_layers, hf.hidden_size
    tokens = tokens or max_sequence_length(cfg.data)
    response_tokens = response_tokens or cfg.data.max_trajectory_length
    rows = max(1, actor.ppo_max_token_len_per_gpu // tokens) if actor.use_dynamic_bsz \
        else actor.ppo_micro_batch_size_per_gpu
    checkpointing = cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    if checkpointing is None:
        checkpointing = total > GRADIENT_CHECKPOINTING_ABOVE
    per_layer = activation_bytes(hidden, getattr(hf, "intermediate_size", None) or 4 * hidden, compute)
    per_token_layer = (2 * compute * hidden * layers + per_layer) if checkpointing else per_layer * layers
    activations = rows * tokens * per_token_layer
    activations += rows * response_tokens * hf.vocab_size * compute  # logits, once
    if uses_critic(cfg):  # the critic's passes (no vocabulary logits) come at other times: the larger of the two
        budget = critic_token_budget(cfg)
        critic_rows = max(1, budget // tokens) if budget else cfg.critic.ppo_micro_batch_size_per_gpu
        activations = max(activations, critic_rows * tokens * per_token_layer)
    activations += 2 * 4 * total / max(layers, 1)  # one gathered layer and its gradient, float32

    head_dim = getattr(hf, "head_dim", None) or hidden // hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    if rollout.name == "hf":  # a micro-batch of the rows one engine generates
        engine_rows = min(rollout.micro_batch_size, -(-trajectories_per_step(cfg) // rollout_world_size(cfg)))
        kv_tokens = tokens
        if hf_static_cache(cfg):  # its shape: the rows padded to a power of two, the length rounded up (hf_decode)
            engine_rows = min(1 << (engine_rows - 1).bit_length(), rollout.micro_batch_size)
            kv_tokens = -(-tokens // LENGTH_QUANTUM) * LENGTH_QUANTUM
        kv_cache = engine_rows * kv_tokens * layers * 2 * kv_heads * head_dim * engine
    elif torch.cuda.is_available():
        kv_cache = max(0.0, rollout.gpu_memory_utilization * device_memory() - rollout_weights)
    else:
        kv_cache = rollout.cpu_kv_cache_gb * GIB
    return MemoryEstimate(weights=weights, optimizer=optimizer, activations=activations, kv_cache=kv_cache,
                          host=host, params=total, trainable=trained)


def hf_static_cache(cfg: Config) -> bool:
    """Whether the HF engine decodes with its static cache (``rollout.hf_kv_cache``; auto: on a GPU), which it keeps
    between calls unless ``rollout.free_cache_engine``."""
    choice = cfg.actor_rollout_ref.rollout.hf_kv_cache
    return choice == "static" or (choice == "auto" and torch.cuda.is_available() and cfg.trainer.device != "cpu")


def device_memory() -> float:
    """Bytes of one device: the first GPU's, else this host's memory, or its memory cgroup's limit when lower (a
    container's limit is what the run can have)."""
    if torch.cuda.is_available():
        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(host_total_bytes() or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class MemoryMeter:
    """The estimate for one run: at start-up at the configured maximum lengths (logged, with a warning when it
    exceeds the device), then each step at the step's longest row (``perf/memory_estimate_gb``, next to the measured
    ``perf/max_rss_gb`` / ``perf/max_memory_allocated_gb``). On a CPU host the process's resident memory before any
    model is counted too (``runtime``): a rank's peak RSS holds it."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.on_gpu = torch.cuda.is_available() and cfg.trainer.device != "cpu"
        self.runtime = 0.0 if self.on_gpu else float(resident_bytes())
        self.counted = count_parameters(cfg)

    def estimate(self, tokens: int | None = None, response_tokens: int | None = None) -> MemoryEstimate:
        estimate = estimate_memory(self.cfg, tokens, response_tokens, self.counted)
        estimate.runtime = self.runtime
        return estimate

    def report(self, lengths: RowLengths | None = None) -> tuple[MemoryEstimate, MemoryEstimate]:
        """Log the estimate at ``lengths`` (the data's; None: the maximum lengths), then the bound at the configured
        maximum lengths; warn when the first exceeds the device (on a CPU host: all ranks of the node together).
        Returns (the estimate, the bound), also kept as ``expected`` and ``bound``."""
        cfg = self.cfg
        longest = max_sequence_length(cfg.data)
        self.bound = self.estimate()
        if lengths is None:
            lengths = RowLengths(longest - cfg.data.max_trajectory_length, cfg.data.max_trajectory_length,
                                 "the configured maximum lengths")
        self.lengths = lengths
        self.expected = self.estimate(min(lengths.prompt + lengths.response, longest), lengths.response)
        logger.info("%s\n  at the data's lengths: rows up to %d tokens, %d of them response (%s)\n  at the configured "
                    "maximum lengths (%d tokens a row, %d of them response): %.2f GiB per device",
                    self.expected.table(), lengths.prompt + lengths.response, lengths.response, lengths.source,
                    longest, cfg.data.max_trajectory_length, self.bound.device_total / GIB)
        ranks_sharing = 1 if self.on_gpu else (cfg.trainer.n_gpus_per_node if cfg.trainer.backend == "ray" else 1)
        need, have = self.expected.device_total * ranks_sharing, device_memory()
        if need > have:
            logger.warning("the run may not fit: about %.1f GiB expected per %s at the data's lengths (rows up to %d "
                           "tokens: %s; %.1f GiB at the configured maximum lengths), %.1f GiB available; each step "
                           "logs perf/memory_estimate_gb at its longest row. Consider "
                           "actor_rollout_ref.model.lora_rank, actor_rollout_ref.actor.fsdp_config.param_offload=true, "
                           "actor_rollout_ref.actor.optim_state_dtype=bfloat16, gradient checkpointing, "
                           "actor_rollout_ref.actor.use_dynamic_bsz or smaller micro-batches or lengths",
                           need / GIB, "GPU" if self.on_gpu else "host", lengths.prompt + lengths.response,
                           lengths.source, self.bound.device_total * ranks_sharing / GIB, have / GIB)
        if self.on_gpu:  # another process holding this run's GPU is named now, not met as an OOM at the first update
            report_other_holders(self.expected.device_total, cfg.trainer.backend)
        return self.expected, self.bound

    def summary(self) -> str:
        """The start-up summary's line (after ``report``)."""
        return (f"memory   about {self.expected.device_total / GIB:.1f} GiB per device at the data's lengths (rows up "
                f"to {self.lengths.prompt + self.lengths.response} tokens); {self.bound.device_total / GIB:.1f} GiB "
                "at the configured maximum lengths")

    def metrics(self, batch) -> dict[str, float]:
        """``perf/memory_estimate_gb`` at the longest row of ``batch`` (trained batch: attention_mask [B, P + R],
        response_mask [B, R])."""
        tokens = int(batch["attention_mask"].sum(-1).max())
        response = int(batch["response_mask"].sum(-1).max())
        return {"perf/memory_estimate_gb": self.estimate(tokens, max(response, 1)).device_total / GIB}


def resident_bytes() -> int:
    """This process's resident set now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
