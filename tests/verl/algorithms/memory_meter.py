"""``LiveBytes``: the peak bytes of tensor storage that torch operations allocate while it is active, on any device.

A ``TorchDispatchMode`` that sees every operation's outputs: a storage not seen before (and not among the ``known``
ones, the inputs that existed already) is counted from its first output until it is freed (a finalizer on the
storage object, which torch keeps alive as long as the storage lives). Views and in-place results reuse a counted
storage and add nothing. CPU-only machines have no allocator statistics; this measures what the code holds, not
what the allocator caches.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes(known=[x]) as meter: ...`` then ``meter.peak`` (bytes allocated and alive at once)."""

    def __init__(self, known: list[torch.Tensor] = ()):
        super().__init__()
        self.seen = {t.untyped_storage().data_ptr() for t in known}
        self.now = self.peak = 0

    def _freed(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and key not in self.seen:
                    self.seen.add(key)
                    self.now += nbytes
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(storage, self._freed, key, nbytes)
        return out
