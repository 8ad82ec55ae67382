"""Optimisation shared by the trainable workers (actor, critic): AdamW + warmup, the PPO update loop, checkpoints.

Choices:

* **Optimiser**: AdamW; the LR rises linearly over the first ``lr_warmup_steps_ratio`` of all
  optimiser steps (step s of W warmup steps uses lr * (s + 1) / W, so the first step already
  moves) and is constant after. The scheduler steps once per optimiser step; the number of
  optimiser steps of a run is training steps x epochs x mini-batches per step.
* **Exact loss normalisation** (the mini-batch is the unit): every micro-batch loss divides by the
  mini-batch's global counts (``loss_mask`` tokens / non-empty rows, summed over micro-batches and
  data-parallel ranks, see ``core_algos.agg_loss``), so summing micro-batch gradients gives the
  full mini-batch gradient. FSDP averages gradients over ranks, so each rank backpropagates
  ``world_size x`` its loss. Result: micro-batch size and world size change only float rounding.
* **Metrics** are sums that add up across micro-batches and ranks to mini-batch values (token
  means are weighted by the micro-batch's share of the global tokens); one all-reduce per
  mini-batch, then the mean over mini-batches and epochs. ``grad_norm`` is the global L2 norm
  before clipping.
* **Non-finite guard**: a mini-batch whose loss (any micro-batch, any rank) or global gradient norm
  is NaN/Inf makes no optimiser step (logged; the scheduler still steps), so it never reaches the
  weights or Adam's moments. Every rank decides alike: the non-finite-loss count travels in the
  metrics' all-reduce and the gradient norm is global, so FSDP ranks never desynchronise. Counted
  in ``skipped_updates`` (with ``nonfinite_loss`` / ``nonfinite_grad_norm`` saying why). A step
  whose finite gradient would still make a weight NaN/Inf (an overflowing update) is undone: the
  trainable weights are copied before the optimiser step (one copy of this rank's shard, held
  during the step) and put back when any weight on any rank is non-finite after it, counted in
  ``skipped_updates`` and ``nonfinite_update`` (Adam's moments keep that finite gradient).
* **Checkpoints**: ``torch.distributed.checkpoint`` for the trainable weights + optimiser (each
  rank writes its own shard; loads into any world size), the scheduler state in ``extra_state.pt``
  from rank 0. Frozen weights (the base model under LoRA) are not written.
* **Optimiser state dtype**: float32 moments (torch's AdamW) or bfloat16 (``optim.py``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from verl.config import OptimConfig
from verl.protocol import Batch
from verl.utils.lr_schedule import lr_schedule_factor
from verl.workers.distributed import all_reduce_, world
from verl.workers.optim import LowPrecisionStateAdamW
from verl.workers.process_memory import apply_host_memory, release_host_memory

logger = logging.getLogger(__name__)

# Checkpoints hold what training changes: every weight, or only the LoRA adapters (frozen weights are
# the model directory's); loading fills exactly those.
TRAINABLE_ONLY = StateDictOptions(ignore_frozen_params=True, strict=False)


@dataclass
class GlobalCounts:
    """What a mini-batch's loss divides by, summed over its micro-batches and all ranks."""

    tokens: float  # counted tokens (loss_mask = 1)
    seqs: float  # rows with at least one counted token


def global_counts(loss_mask: Tensor) -> GlobalCounts:
    """Counts of this rank's mini-batch ``loss_mask`` [b, R], all-reduced over ranks; at least 1 each,
    so a mini-batch without policy tokens gives a zero loss, not 0 / 0."""
    local = torch.stack([(loss_mask != 0).sum(), (loss_mask != 0).any(dim=-1).sum()]).double()
    tokens, seqs = all_reduce_(local).clamp(min=1.0).tolist()
    return GlobalCounts(tokens=tokens, seqs=seqs)


def token_weight(mask: Tensor, counts: GlobalCounts) -> float:
    """Share of the mini-batch's counted tokens held by this micro-batch's ``mask`` [b, R]."""
    return float((mask != 0).sum()) / max(counts.tokens, 1.0)


# A micro-batch loss: (micro-batch, global counts) -> (loss scalar, metric sums that add up to mini-batch values).
LossFn = Callable[[Batch, GlobalCounts], tuple[Tensor, dict[str, float]]]


# Metrics that are counts: summed over mini-batches and epochs (the others are averaged).
COUNTS = ("skipped_updates", "nonfinite_loss", "nonfinite_grad_norm", "nonfinite_update")
MAX_SUFFIX = "_max"  # a loss_fn metric named *_max is a maximum: over micro-batches, ranks and mini-batches


def optimizer_steps_per_training_step(rows: int, mini_batch_size: int, epochs: int) -> int:
    """Optimiser steps one ``update`` call makes for a batch of ``rows`` rows (all ranks together)."""
    return epochs * math.ceil(rows / mini_batch_size)


class TrainState:
    """A trainable model with its AdamW optimiser, learning-rate schedule and checkpoint I/O."""

    def __init__(self, model: nn.Module, lr: float, weight_decay: float, warmup_ratio: float,
                 total_optimizer_steps: int, grad_clip: float | None, state_dtype: torch.dtype = torch.float32,
                 betas: tuple[float, float] = (0.9, 0.999), schedule: str = "constant", min_lr_ratio: float = 0.0,
                 host_memory: str = "reuse"):
        self.model = model
        self.grad_clip = grad_clip
        # trainer.host_memory on a host (process_memory): free pages handed back after each optimiser step (reuse:
        # kept for the step's micro-batches until then) or after each micro-batch (release); None on a GPU
        self.host_memory = host_memory if all(p.device.type == "cpu" for p in model.parameters()) else None
        if self.host_memory:
            apply_host_memory(host_memory)
        trainable = [p for p in model.parameters() if p.requires_grad]  # all, or the LoRA adapters
        betas = (float(betas[0]), float(betas[1]))
        self.optimizer = torch.optim.AdamW(trainable, lr=lr, betas=betas, weight_decay=weight_decay) \
            if state_dtype == torch.float32 else \
            LowPrecisionStateAdamW(trainable, lr=lr, betas=betas, weight_decay=weight_decay, state_dtype=state_dtype)
        warmup = int(warmup_ratio * total_optimizer_steps)
        lr_schedule_factor(0, warmup, total_optimizer_steps, schedule, min_lr_ratio)  # an unknown schedule fails here
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_schedule_factor(s, warmup, total_optimizer_steps, schedule, min_lr_ratio))
        # called after every optimiser step and checkpoint load (a compute-dtype copy of the weights: weight_copy.py)
        self.after_weights_change: list[Callable[[], None]] = []

    @classmethod
    def from_optim(cls, model: nn.Module, optim: OptimConfig, total_optimizer_steps: int, grad_clip: float | None,
                   state_dtype: torch.dtype = torch.float32, host_memory: str = "reuse") -> TrainState:
        """The state for an ``optim`` section (``verl.config.OptimConfig``: the actor's, the critic's or the SFT
        trainer's), so every trainer reads the same knobs the same way; ``host_memory``: ``trainer.host_memory``."""
        return cls(model, optim.lr, optim.weight_decay, optim.lr_warmup_steps_ratio, total_optimizer_steps, grad_clip,
                   state_dtype, betas=(optim.betas[0], optim.betas[1]), schedule=optim.warmup_style,
                   min_lr_ratio=optim.min_lr_ratio or 0.0, host_memory=host_memory)

    def update(self, batch: Batch, mini_batch_size: int, epochs: int,
               split_micro: Callable[[Batch], list[Batch]], loss_fn: LossFn) -> dict[str, float]:
        """``epochs`` passes over ``batch`` (this rank's rows) in mini-batches, one optimiser step each.

        Args:
            mini_batch_size: rows per optimiser step over all ranks; each rank takes its share.
            split_micro: splits a mini-batch into micro-batches (gradients are accumulated).
            loss_fn: the role's micro-batch loss.
        Returns metrics averaged over mini-batches: the loss_fn's sums plus ``grad_norm`` and ``lr``; maxima for its
        ``*_max`` metrics; and summed (``COUNTS``): ``skipped_updates``, ``nonfinite_loss`` (micro-batches, all ranks),
        ``nonfinite_grad_norm`` and ``nonfinite_update``.
        """
        world_size = world()[1]
        if mini_batch_size % world_size:
            raise ValueError(f"ppo_mini_batch_size={mini_batch_size} does not divide over world_size={world_size}")
        history: dict[str, list[float]] = defaultdict(list)
        for _ in range(epochs):
            for mini in batch.split(mini_batch_size // world_size):
                for name, value in self._update_mini_batch(mini, split_micro, loss_fn).items():
                    history[name].append(value)
        return {name: sum(values) if name in COUNTS else max(values) if name.endswith(MAX_SUFFIX)
                else sum(values) / len(values) for name, values in history.items()}

    def _update_mini_batch(self, mini: Batch, split_micro: Callable[[Batch], list[Batch]],
                           loss_fn: LossFn) -> dict[str, float]:
        world_size = world()[1]
        counts = global_counts(mini["loss_mask"])
        self.optimizer.zero_grad(set_to_none=True)
        micros = split_micro(mini)
        sums: dict[str, float] = defaultdict(float)
        for i, micro in enumerate(micros):
            if isinstance(self.model, FSDPModule):
                self.model.set_requires_gradient_sync(i == len(micros) - 1)  # reduce-scatter once per step
            loss, metrics = loss_fn(micro, counts)
            (loss * world_size).backward()  # even when non-finite: FSDP's collectives run on every rank
            if self.host_memory == "release":  # the micro-batch's activations, freed, leave the resident set too
                release_host_memory()
            sums["nonfinite_loss"] += float(not torch.isfinite(loss.detach()).item())
            for name, value in metrics.items():
                sums[name] = max(sums.get(name, value), value) if name.endswith(MAX_SUFFIX) else sums[name] + value
        names = sorted(n for n in sums if not n.endswith(MAX_SUFFIX))
        maxima = sorted(n for n in sums if n.endswith(MAX_SUFFIX))  # the same on every rank: every loss_fn logs them
        reduced = dict(zip(names, all_reduce_(torch.tensor([sums[n] for n in names], dtype=torch.float64)).tolist(),
                           strict=True))
        if maxima:
            reduced.update(zip(maxima, all_reduce_(torch.tensor([sums[n] for n in maxima], dtype=torch.float64),
                                                   dist.ReduceOp.MAX).tolist(), strict=True))
        grad_norm, lr, undone = self._optimizer_step(skip=reduced["nonfinite_loss"] > 0)
        if self.host_memory == "reuse":  # the step's freed blocks and holes leave the resident set: it cannot creep
            release_host_memory()
        for hook in self.after_weights_change:
            hook()
        finite_norm = math.isfinite(grad_norm)
        skipped = reduced["nonfinite_loss"] > 0 or not finite_norm or undone
        return {**reduced, "grad_norm": grad_norm, "lr": lr, "skipped_updates": float(skipped),
                "nonfinite_grad_norm": float(not finite_norm), "nonfinite_update": float(undone)}

    def _optimizer_step(self, skip: bool) -> tuple[float, float, bool]:
        """Clip (global L2 norm), step optimiser and scheduler; returns (grad norm before clipping, lr used, whether
        the step was undone because it made a weight non-finite).

        No optimiser step when ``skip`` (a non-finite loss) or the gradient norm is non-finite.
        """
        max_norm = self.grad_clip if self.grad_clip is not None else math.inf
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        lr = self.scheduler.get_last_lr()[0]
        undone = False
        if skip or not torch.isfinite(grad_norm):
            logger.warning("non-finite %s: optimiser step skipped", "loss" if skip else f"gradient norm {grad_norm}")
        else:
            undone = self._step_finite()
        self.scheduler.step()
        return float(grad_norm), lr, undone

    def _step_finite(self) -> bool:
        """``optimizer.step()``, undone when it leaves any trainable weight NaN/Inf on any rank; True if undone."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        self.optimizer.step()
        with torch.no_grad():
            bad = torch.tensor([float(not all(torch.isfinite(_local(p)).all() for p in params))], dtype=torch.float64)
            if all_reduce_(bad).item() == 0:
                return False
            for p, saved in zip(params, before, strict=True):
                p.copy_(saved)
        logger.warning("the optimiser step made a weight NaN/Inf (lr %g): step undone, the weights are the step's "
                       "start", self.scheduler.get_last_lr()[0])
        return True

    def _trainable_state(self) -> tuple[dict, dict]:
        """(model, optimiser) state dicts of the trainable weights only. ``ignore_frozen_params`` alone
        keeps a frozen weight's second name when it is tied (a LoRA base's LM head = its embeddings)."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=TRAINABLE_ONLY)
        trainable = {name for name, p in self.model.named_parameters(remove_duplicate=False) if p.requires_grad}
        return {k: v for k, v in model_state.items() if k in trainable}, optim_state

    def save(self, path: str) -> None:
        """Write the trainable weights (all, or the LoRA adapters), optimiser (sharded, every rank) and scheduler
        (rank 0) under ``path``; frozen weights are the model directory's and are not written."""
        model_state, optim_state = self._trainable_state()
        with _single_process_dcp():
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path, no_dist=world()[1] == 1)
        if world()[0] == 0:
            torch.save({"scheduler": self.scheduler.state_dict()}, Path(path) / "extra_state.pt")
        if world()[1] > 1:
            dist.barrier()

    def load(self, path: str) -> None:
        """Restore what ``save`` wrote (any world size); the next update continues exactly."""
        model_state, optim_state = self._trainable_state()
        state = {"model": model_state, "optim": optim_state}
        with _single_process_dcp():
            dcp.load(state, checkpoint_id=path, no_dist=world()[1] == 1)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=TRAINABLE_ONLY)
        extra = torch.load(Path(path) / "extra_state.pt", weights_only=True)
        self.scheduler.load_state_dict(extra["scheduler"])
        for hook in self.after_weights_change:
            hook()


def _local(t: Tensor) -> Tensor:
    """This rank's part of a (possibly FSDP-sharded) tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


@contextlib.contextmanager
def _single_process_dcp() -> Iterator[None]:
    """Silence torch.distributed.checkpoint's warning that it runs in one process (we ask it to)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield
