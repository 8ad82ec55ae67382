"""Batch: the one container passed between the controller, the workers and the agent loop.

A ``Batch`` holds equal-length tensors (dim 0 = rows), equal-length numpy object arrays for
non-tensor per-row data (uids, ground truths, stop reasons), and a free ``meta`` dict for
batch-level values (temperature, step). Rows stay aligned under every operation.

Choice: a small dataclass over plain dicts instead of ``tensordict.TensorDict``: we need
non-tensor columns and meta next to the tensors, and the operations (select, index, chunk,
concat, union, repeat) are a few lines each on top of torch/numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {k: as_row_array(v) for k, v in self.non_tensors.items()}
        lengths = {k: len(v) for k, v in {**self.tensors, **self.non_tensors}.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"Batch columns differ in length: {lengths}")

    def __len__(self) -> int:
        for column in (*self.tensors.values(), *self.non_tensors.values()):
            return len(column)
        return 0

    def __getitem__(self, key: str) -> torch.Tensor | np.ndarray:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"Batch has no column {key!r}; columns: {sorted(self.keys())}")

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def select(self, *keys: str) -> Batch:
        """A batch with only the named columns (meta is kept)."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"Batch has no columns {missing}; columns: {sorted(self.keys())}")
        return Batch({k: v for k, v in self.tensors.items() if k in keys},
                     {k: v for k, v in self.non_tensors.items() if k in keys}, dict(self.meta))

    def index(self, idx: torch.Tensor | np.ndarray | list[int] | slice) -> Batch:
        """Rows ``idx`` of every column, in that order."""
        if isinstance(idx, slice):
            np_idx = t_idx = idx
        else:
            np_idx = np.asarray(idx.cpu() if isinstance(idx, torch.Tensor) else idx, dtype=np.int64)
            t_idx = torch.as_tensor(np_idx)
        return Batch({k: v[t_idx] for k, v in self.tensors.items()},
                     {k: v[np_idx] for k, v in self.non_tensors.items()}, dict(self.meta))

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of ``size`` rows (the last may be shorter)."""
        return [self.index(slice(i, i + size)) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list[Batch]:
        """``n`` consecutive chunks of equal size; the batch length must divide by ``n``."""
        if len(self) % n:
            raise ValueError(f"cannot chunk a batch of {len(self)} rows into {n} equal parts")
        return self.split(len(self) // n)

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        """Rows of all batches, in order; columns must match; meta from the first batch."""
        if not batches:
            raise ValueError("concat of an empty list of batches")
        keys = set(batches[0].keys())
        for b in batches[1:]:
            if set(b.keys()) != keys:
                raise ValueError(f"concat of batches with different columns: {sorted(keys)} vs {sorted(b.keys())}")
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in batches[0].tensors}
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in batches[0].non_tensors}
        return Batch(tensors, non_tensors, dict(batches[0].meta))

    def union(self, other: Batch) -> Batch:
        """Columns of both batches; a column in both must be equal, else ValueError names it."""
        if len(self) != len(other) and self.keys() and other.keys():
            raise ValueError(f"union of batches with {len(self)} and {len(other)} rows")
        tensors = dict(self.tensors)
        for k, v in other.tensors.items():
            if k in tensors and not (tensors[k].shape == v.shape and torch.equal(tensors[k], v)):
                raise ValueError(f"union: tensor column {k!r} differs between the two batches")
            tensors[k] = v
        non_tensors = dict(self.non_tensors)
        for k, v in other.non_tensors.items():
            if k in non_tensors and not np.array_equal(non_tensors[k], v):
                raise ValueError(f"union: non-tensor column {k!r} differs between the two batches")
            non_tensors[k] = v
        for k, v in other.meta.items():
            if k in self.meta and self.meta[k] != v:
                raise ValueError(f"union: meta {k!r} differs between the two batches")
        return Batch(tensors, non_tensors, {**self.meta, **other.meta})

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row ``n`` times: interleaved (a a b b) by default, else tiled (a b a b)."""
        rows = np.arange(len(self))
        idx = np.repeat(rows, n) if interleave else np.tile(rows, n)
        return self.index(idx)

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.non_tensors), dict(self.meta))


def as_row_array(values: Any) -> np.ndarray:
    """Per-row values as a 1-D numpy array (dtype object unless already an array)."""
    if isinstance(values, np.ndarray):
        return values
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out
