"""Model FLOPs utilisation (MFU): the FLOPs a step's passes needed, over the time they took at the device's peak.

Accounting (model FLOPs, as in the PaLM paper's appendix B: what the model needs, not what the kernels did):

* A forward pass over one row of ``T`` tokens costs ``2 W T`` for the matrix products with the weights (``W``: the
  weights of every ``nn.Linear`` of the model, the LM head included, counted on the meta device, so any Hugging Face
  causal LM works with no per-family code) plus ``4 L A T (T + 1) / 2`` for attention's two products (``L`` layers,
  ``A`` = heads x head_dim; causal: token t attends t + 1 keys).
* Training = 3 forwards (the backward costs two); recomputation under gradient checkpointing is not counted.
* Generation = one forward over each row's final tokens (prompt + response): with a KV cache each token goes through
  the model once, so re-reading a context (a later turn's prefill without a prefix cache) counts as lost time, not
  as work.
* Peak: the device's measured dense matmul rate in the pass's dtype (``measure_peak_flops``; ``trainer.peak_tflops``
  sets it instead), per device: ``world`` GPUs, or one CPU host shared by its ranks.

``benchmarks/bench_peak.py`` prints the peak; the trainer logs ``perf/mfu/<phase>`` every step (``PPOTrainer._perf``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from verl.config import Config, world_size
from verl.workers.model_utils import DTYPES


@dataclass(frozen=True)
class ModelFlops:
    """What a forward pass of one model costs per token (see the module docstring)."""

    linear_weights: int  # W
    layers: int  # L
    attention_width: int  # A = heads x head_dim

    @classmethod
    def of(cls, model: nn.Module) -> ModelFlops:
        """From a model (real or on the meta device)."""
        cfg = model.config
        cfg = getattr(cfg, "text_config", None) or cfg  # multimodal wrappers keep the LM's config inside
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
        return cls(weights, cfg.num_hidden_layers, heads * head_dim)

    def forward(self, lengths: Tensor) -> float:
        """FLOPs of one forward pass over rows of ``lengths`` [B] tokens each."""
        t = lengths.double()
        return float((2 * self.linear_weights * t + 4 * self.layers * self.attention_width * t * (t + 1) / 2).sum())


def measure_peak_flops(device: torch.device | str, dtype: str, size: int | None = None, repeats: int = 3) -> float:
    """The best rate (FLOP/s) of ``size`` x ``size`` matrix products in ``dtype`` on ``device``, after one warm-up:
    what dense work can reach there (4096 on a GPU, 1024 on a CPU by default: about 0.2 s on a 2-core host)."""
    device = torch.device(device)
    size = size or (4096 if device.type == "cuda" else 1024)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=DTYPES[dtype])
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=DTYPES[dtype])
    best = float("inf")
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(4 if device.type == "cuda" else 1):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first is the warm-up
            best = min(best, (time.perf_counter() - start) / (4 if device.type == "cuda" else 1))
    return 2 * size**3 / best


class MfuMeter:
    """``perf/mfu/<phase>`` of a training step: generation, the log-prob passes and the actor's update.

    Peaks: ``trainer.peak_tflops``, else measured once on the actor group's rank 0 in each pass's dtype. The
    generation phase's time (``timing/gen``) includes the environment's replies and the reward.
    """

    def __init__(self, cfg: Config, model: nn.Module, peak_flops: Callable[[list[str]], dict[str, float]]) -> None:
        """``peak_flops(dtypes)``: one device's measured FLOP/s per dtype (the actor's rank 0 measures them)."""
        a = cfg.actor_rollout_ref
        self.flops = ModelFlops.of(model)
        self.passes = {"gen": 1, "old_log_prob": 1, "ref": 1, "update_actor": 3 * a.actor.ppo_epochs}  # forwards
        dtypes = {"gen": a.rollout.dtype, "old_log_prob": a.actor.fsdp_config.dtype, "ref": a.ref.fsdp_config.dtype,
                  "update_actor": a.actor.fsdp_config.dtype}
        peak = cfg.trainer.peak_tflops
        measured = {d: peak * 1e12 for d in dtypes.values()} if peak else \
            peak_flops(sorted(set(dtypes.values())))
        self.peaks = {phase: measured[d] for phase, d in dtypes.items()}  # FLOP/s of one device
        on_gpu = torch.cuda.is_available() and cfg.trainer.device != "cpu"
        self.devices = world_size(cfg) if on_gpu else 1  # the ranks of a CPU host share it

    def metrics(self, batch, seconds: Mapping[str, float]) -> dict[str, float]:
        """For each pass of ``seconds`` (phase -> seconds it took: ``gen``, ``old_log_prob``, ``ref``,
        ``update_actor``; the others are ignored): its model FLOPs over the batch's rows / (seconds x peak x
        devices)."""
        forward = self.flops.forward(batch["attention_mask"].sum(-1))  # [B] tokens per row
        out = {}
        for phase, forwards in self.passes.items():
            took = seconds.get(phase)
            if took:
                out[f"perf/mfu/{phase}"] = forwards * forward / (took * self.peaks[phase] * self.devices)
        return out
