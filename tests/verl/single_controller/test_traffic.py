"""The driver's traffic: every worker-group call's arguments and results are metered, whatever the method.

Guards against a driver metric that counts only the results of one named call (``perf/sync_bytes_driver``
once did: weights sent through the driver as the arguments of another call, or returned by another method,
read 0), and against a payload measure that misses the data a call really carries (token lists, object
columns, dataclasses).
"""

from __future__ import annotations

import numpy as np
import torch

from verl.protocol import Batch
from verl.single_controller import create_worker_group
from verl.single_controller.base import Traffic, payload_bytes
from verl.workers.rollout.base import GenerationOutput


class Holder:
    """A worker with 1,000 float32 "weights" and a few methods, built like a real role (cfg, **kwargs)."""

    def __init__(self, cfg, **init_kwargs):
        self.weights = torch.zeros(1000)

    def state(self) -> dict[str, torch.Tensor]:
        return {"w": self.weights}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.weights = state["w"].clone()

    def double(self, batch: Batch) -> Batch:
        return Batch({"y": batch["x"] * 2})

    def stats(self) -> dict[str, float]:
        return {"seconds": 0.5}


def test_payload_bytes_counts_what_a_call_carries():
    assert payload_bytes(None) == 0 and payload_bytes([]) == 0
    assert payload_bytes(torch.zeros(3, 5)) == 60 and payload_bytes(torch.zeros(4, dtype=torch.bfloat16)) == 8
    assert payload_bytes(np.zeros(10, dtype=np.int32)) == 40
    assert payload_bytes([1, 2, 3]) == 24 and payload_bytes((1.5, True)) == 16 and payload_bytes("héllo") == 6
    assert payload_bytes({"ab": 1.0}) == 2 + 8
    out = GenerationOutput(token_ids=[1, 2, 3, 4], finish_reason="stop", stop_str=None, logprobs=[0.1] * 4)
    assert payload_bytes(out) == 32 + 4 + 32
    ids = np.empty(2, dtype=object)
    ids[:] = [[1, 2], [3, 4, 5]]  # ragged token-id lists, as a Batch holds raw_prompt_ids
    batch = Batch({"x": torch.zeros(2, 3)}, {"raw_prompt_ids": ids, "uid": ["a", "bc"]}, {"step": 1})
    assert payload_bytes(batch) == 24 + (5 * 8) + 3 + (len("step") + 8) + len("raw_prompt_ids") + len("uid") + 1


def test_every_call_is_metered_both_ways_and_taken_once():
    group = create_worker_group(Holder, None, "local", 1)
    assert group.take_traffic() == Traffic()
    stats, weights = len("seconds") + 8, len("w") + 4000
    group.execute_all(Holder.stats)
    assert group.traffic == Traffic(to_workers=0, to_driver=stats)
    state = group.execute_all(Holder.state)[0]  # weights returned to the driver
    assert group.traffic.to_driver == stats + weights
    group.execute_all(Holder.load, state)  # ... and sent back as an argument
    assert group.traffic.to_workers == weights
    batch = Batch({"x": torch.ones(4, 2)})
    out = group.execute_split(Holder.double, batch)
    assert torch.equal(out["y"], 2 * batch["x"])
    assert group.take_traffic() == Traffic(to_workers=weights + len("x") + 32,
                                           to_driver=stats + weights + len("y") + 32)
    group.execute_each(Holder.stats, [()])
    assert group.take_traffic() == Traffic(to_workers=0, to_driver=stats)
    assert group.traffic.total == 0
