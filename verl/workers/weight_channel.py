"""Weights from the first training rank straight to the rollout ranks (``trainer.rollout_ranks``), never via the driver.

A dedicated gloo process group of ``1 + N`` members (member 0 = training rank 0, member ``1 + r`` = rollout rank
``r``), built from its own TCP store on training rank 0's node, apart from each worker group's torch.distributed
world. A sync streams the (name, full tensor) pairs one at a time: per tensor, a header broadcast (the length of
its pickled (name, shape, dtype), then those bytes) and the tensor itself; an empty header ends the stream. Each
rollout rank receives into a fresh buffer and hands it to its engine before the next arrives, so the extra memory
is one tensor on either side.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(minutes=30)


class WeightChannel:
    """One member's end of the channel; ``send`` on member 0, ``receive`` on the others (all at once)."""

    def __init__(self, host: str, port: int, member: int, members: int):
        self.member, self.members = member, members
        self.store = dist.TCPStore(host, port, world_size=members, is_master=member == 0, timeout=TIMEOUT)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("weights", self.store), member, members, TIMEOUT)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()

    def send(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Broadcast every (name, tensor) to the other members; returns the tensor bytes sent."""
        sent = 0
        for name, tensor in named:
            tensor = tensor.detach().contiguous().cpu()
            self._header((name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")))
            self._broadcast(tensor)
            sent += tensor.numel() * tensor.element_size()
        self._header(None)
        return sent

    def _header(self, meta: tuple | None) -> None:
        data = b"" if meta is None else pickle.dumps(meta)
        self._broadcast(torch.tensor([len(data)], dtype=torch.int64))
        if data:
            self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The (name, tensor) pairs member 0 sends, one at a time, until its end of stream."""
        while True:
            length = torch.zeros(1, dtype=torch.int64)
            self._broadcast(length)
            if int(length) == 0:
                return
            raw = torch.empty(int(length), dtype=torch.uint8)
            self._broadcast(raw)
            name, shape, dtype = pickle.loads(raw.numpy().tobytes())
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            self._broadcast(tensor)
            yield name, tensor
