"""The engine calls a rank serves to the driver's ``GroupRollout``: shared by ``ActorRolloutWorker`` (an engine
beside the rank's FSDP shard) and ``RolloutWorker`` (a rank that only generates).

Every call that runs the engine adds its wall time to ``rollout_busy_s`` (the trainer's ``perf/rollout_idle_frac``
compares it with the wall time of a generation). A weight sync into the engine returns a ``WeightSyncStats``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor

from verl.workers.rollout.base import GenerationOutput, RolloutEngine, SamplingParams


@dataclass
class WeightSyncStats:
    """One rank's share of a weight sync (``ActorRolloutWorker.sync_rollout_weights`` / ``send_weights``,
    ``RolloutWorker.receive_weights``)."""

    tensors: int = 0  # (name, tensor) pairs handed to the engine or sent on
    engine_bytes: int = 0  # their bytes, in the engine's dtype
    gathered_bytes: int = 0  # bytes this rank received from other ranks in the all-gathers (0 on a rollout rank)
    seconds: float = 0.0

    def counted(self, named: Iterator[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        """``named`` unchanged, each pair counted into ``tensors`` and ``engine_bytes`` as it passes."""
        for name, tensor in named:
            self.tensors += 1
            self.engine_bytes += tensor.numel() * tensor.element_size()
            yield name, tensor


class EngineHost:
    engine: RolloutEngine | None
    rollout_busy_s: float = 0.0  # seconds spent in engine calls since take_rollout_busy_s

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.rollout_busy_s += time.perf_counter() - start

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        """This rank's share of a generate call (``Generator.generate``); no rows -> no engine call."""
        if not prompts:
            return []
        with self._busy():
            return self.engine.generate(prompts, params)

    def engine_step(self, new: list, max_steps: int) -> list:
        """Continuous batching (engines with ``step_requests``: vLLM): add ``new``, step until one finishes."""
        with self._busy():
            return self.engine.step_requests(new, max_steps)

    def engine_abort(self, request_ids: list[str]) -> None:
        self.engine.abort_requests(request_ids)

    def can_step(self) -> bool:
        return hasattr(self.engine, "step_requests")

    def take_rollout_busy_s(self) -> float:
        """Seconds this rank's engine spent generating since the previous call (then reset)."""
        busy, self.rollout_busy_s = self.rollout_busy_s, 0.0
        return busy
