"""What a PPO step returns and logs: its typed result, and the metrics computed from its batch (``PPOTrainer`` says
when each is taken; nothing here calls a worker or reads the config).

- ``StepResult``: what ``PPOTrainer.run_step`` returns: the trained batch, the step's metrics (each phase returns
  its own: generation's ride in ``pipeline.Generated``, the workers' come back from their calls) and a
  ``StepTimings``, the seconds of every phase that ran (``timing/<phase>``), each measured by the code that runs
  the phase (``timed``) and returned, never written into a dict handed down.
- ``data_metrics``: the reward, advantage, return and value means over the counted tokens (``loss_mask``), the
  response lengths, and the recipe's per-row ``reward/*`` terms.
- ``mismatch_metrics`` / ``update_metrics``: ``rollout/*``, the engines' log-probs against the trainer's over the
  policy tokens. From the old-log-prob pass when it runs; on an on-policy step (no such pass,
  ``config.recomputes_old_log_probs``) the actor's update measures them in its own forward pass and returns them
  as ``actor/rollout_*``, which ``update_metrics`` renames, so a run logs the same keys either way.
- ``perf_metrics``: throughput and the payload the step's worker-group calls moved through the driver.
- ``validation_metrics``: a validation's per-row values -> ``val/<name>`` overall and ``val/<name>/<data_source>``;
  ``logged_validations``: the validations a resumed run already logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ParamSpec, TypeVar

import numpy as np
import torch

from verl.algorithms import core_algos
from verl.protocol import Batch
from verl.single_controller.base import Traffic
from verl.utils.tracking import read_metrics

P = ParamSpec("P")
T = TypeVar("T")


def timed(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> tuple[T, float]:
    """``fn(*args, **kwargs)`` and the seconds it took."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


@dataclass
class StepTimings:
    """Seconds of each phase of one training step, logged as ``timing/<phase>``; ``None``: the phase did not run
    (no critic: no ``values``; an on-policy update: no ``old_log_prob``; an on-policy critic: no ``values``, its
    update measures them; a skipped update: no ``update_*``)."""

    wait_rollout: float | None = None  # the trainer waiting for its batch (pipeline.py)
    gen: float | None = None  # generating and scoring the batch, every round (in the producer thread if pipelined)
    old_log_prob: float | None = None
    ref: float | None = None
    values: float | None = None
    adv: float | None = None
    update_critic: float | None = None
    update_actor: float | None = None
    sync: float | None = None  # the weight sync, with the waits for the engines' calls in flight
    validate: float | None = None
    step: float | None = None  # the whole step, every phase above

    def phases(self) -> dict[str, float]:
        """Phase -> seconds, for the phases that ran."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def metrics(self) -> dict[str, float]:
        """``timing/<phase>`` for the phases that ran."""
        return {f"timing/{name}": seconds for name, seconds in self.phases().items()}


@dataclass
class StepResult:
    """A training step's outcome (``PPOTrainer.train_on`` returns its part; ``run_step`` completes it)."""

    batch: Batch  # the trained batch: every column of the step (verl/trainer/columns.py)
    metrics: dict[str, float]
    updated: bool  # the actor was updated: its new weights go to the engines
    timings: StepTimings = field(default_factory=StepTimings)
    records: list[dict] = field(default_factory=list)  # every row's trajectory record (verl.utils.rollout_log)


# rollout/* of an on-policy step come from the update's forward pass (actor.py), under the actor's prefix
_FUSED_MISMATCH = {f"actor/rollout_{name}": f"rollout/{name}" for name in ("logprob_diff_mean", "logprob_diff_max",
                                                                             "kl_k3")}


def _mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(core_algos.masked_mean(x.float(), mask.float()))


def data_metrics(batch: Batch) -> dict[str, float]:
    """Means over the step's trained batch: scores and rewards per row, advantages, returns and values per counted
    token (``loss_mask``, ``[B, R]``), response lengths with and without the masked tokens. (Its generation metrics
    come with it, in ``pipeline.Generated.metrics``.)"""
    mask, rmask = batch["loss_mask"].float(), batch["response_mask"].float()  # [B, R]
    metrics = {
        "critic/score/mean": float(np.mean(batch["score"])),
        **{key: float(np.mean(batch[key].astype(np.float64))) for key in batch.non_tensors
           if key.startswith("reward/")},
        "critic/rewards/mean": float(batch["token_level_rewards"].sum(-1).mean()),
        "critic/advantages/mean": _mean(batch["advantages"], mask),
        "critic/returns/mean": _mean(batch["returns"], mask),
        "response_length/mean": float(rmask.sum(-1).mean()),
        "response_length/trained_mean": float(mask.sum(-1).mean()),
    }
    if "values" in batch:
        metrics["critic/values/mean"] = _mean(batch["values"], mask)
    return metrics


def mismatch_metrics(batch: Batch) -> dict[str, float]:
    """``rollout/*``: the engines' log-probs against the trainer's old log-probs over the policy tokens (response
    tokens the policy sampled, whatever ``state_masking`` says); {} when the step has no old-log-prob pass."""
    if "rollout_log_probs" not in batch or "old_log_probs" not in batch:  # on-policy: the update logs them
        return {}
    policy_tokens = batch["response_mask"] * batch["info_mask"]  # [B, R], 1 = sampled by the policy
    mismatch = core_algos.rollout_mismatch(batch["old_log_probs"], batch["rollout_log_probs"], policy_tokens)
    return {f"rollout/{name}": value for name, value in mismatch.items()}


def update_metrics(actor_metrics: dict[str, float]) -> dict[str, float]:
    """The actor update's metrics, with the mismatch it measured on an on-policy step under ``rollout/*``."""
    return {_FUSED_MISMATCH.get(name, name): value for name, value in actor_metrics.items()}


def perf_metrics(batch: Batch, timings: StepTimings, traffic: Traffic) -> dict[str, float]:
    """Tokens per second over the step and over generation, and the step's driver traffic (``traffic``)."""
    tokens = float(batch["attention_mask"].sum())
    return {"perf/tokens_per_s": tokens / max(timings.step, 1e-9),
            "perf/gen_tokens_per_s": float(batch["response_mask"].sum()) / max(timings.gen, 1e-9),
            "perf/driver_bytes_to_workers": float(traffic.to_workers),
            "perf/driver_bytes_from_workers": float(traffic.to_driver)}


def validation_metrics(per_row: dict[str, list]) -> dict[str, float]:
    """``per_row``: ``data_source`` and one value per validation row for each metric (``score``, the recipe's row
    metrics) -> ``val/<name>`` (the mean over all rows) and ``val/<name>/<source>`` (over that source's rows)."""
    sources = np.array(per_row["data_source"])
    metrics = {}
    for name, values in per_row.items():
        if name == "data_source":
            continue
        values = np.asarray(values, dtype=np.float64)
        metrics[f"val/{name}"] = float(values.mean())
        for source in sorted(set(sources)):
            metrics[f"val/{name}/{source}"] = float(values[sources == source].mean())
    return metrics


def logged_validations(jsonl_path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(the validation before the first step, the latest validation) of a run's metrics.jsonl ({} if none)."""
    if not jsonl_path.exists():
        return {}, {}
    validations = [(r.get("step", 0), {k: v for k, v in r.items() if k.startswith("val/")})
                   for r in read_metrics(jsonl_path)]
    validations = [(step, val) for step, val in validations if val]
    before = next((val for step, val in validations if step == 0), {})
    return before, (validations[-1][1] if validations else {})
