"""A rank that only generates (``trainer.rollout_ranks``: disaggregated placement).

Holds an engine (``build_rollout``; vLLM joins this group's own torch.distributed world, so consecutive rollout
ranks form tensor-parallel engines as on the actor ranks) and no trained weights. It serves the same engine calls
as ``ActorRolloutWorker`` (``EngineHost``), so ``GroupRollout`` drives either group; its
weights arrive from training rank 0 over a ``WeightChannel``.
"""

from __future__ import annotations

import time

from verl.config import Config
from verl.workers.engine_host import EngineHost, WeightSyncStats
from verl.workers.rollout import build_rollout
from verl.workers.weight_channel import WeightChannel


class RolloutWorker(EngineHost):
    def __init__(self, cfg: Config, total_steps: int):
        self.cfg = cfg
        self.engine = build_rollout(cfg)
        self.channel: WeightChannel | None = None

    def join_weight_channel(self, host: str, port: int, member: int, members: int) -> None:
        self.channel = WeightChannel(host, port, member, members)

    def receive_weights(self) -> WeightSyncStats:
        """Stream the weights training rank 0 is sending into this rank's engine."""
        start = time.perf_counter()
        stats = WeightSyncStats()
        self.engine.sync_weights(stats.counted(self.channel.receive()))
        stats.seconds = time.perf_counter() - start
        return stats

