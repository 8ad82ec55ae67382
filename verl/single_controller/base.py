"""The worker-group interface, the in-process backend and the factory over both backends.

A worker group holds ``world_size`` instances of one worker class (one data-parallel rank each).
The single controller (the trainer) drives it through the typed proxies of ``roles.py``
(``actor.compute_log_prob(batch)``), each of which makes one of these calls. A call names the worker
method by the method itself (``ActorWorker.compute_log_prob``, never a string), so an editor's
go-to-definition and a reader both reach the code that runs, and a method of another class is refused
before any rank is called:

* ``execute_split(method, batch)``: split the batch into ``world_size`` equal consecutive chunks,
  call ``method(chunk)`` on every rank in parallel, and combine: ``Batch`` results are
  concatenated in rank order (so rows come back in input order); ``dict`` results (metrics,
  already all-reduced by the workers) are rank 0's.
* ``execute_all(method, *args, **kwargs)``: the same call on every rank, results in rank order
  (checkpoints, weight sync, export: collectives that every rank must enter).
* ``execute_each(method, args_per_rank)``: ``method(*args_per_rank[r])`` on rank r, in parallel,
  results in rank order (generation: each rank continues its own share of the rows).
* ``execute_ranks(method, ranks, *args)``: the same call on some ranks only (the asynchronous rollout
  calls one engine's ranks while the other engines are busy with their own calls). Calls to disjoint
  ranks may come from several driver threads at once; a rank runs its calls one at a time.

All of them go through one primitive per backend (``_run``, which gets the method's name: the wire format of a
Ray call), which is where the driver's traffic is
metered: ``traffic`` adds up the payload of every call's arguments (driver -> workers) and of every
result (workers -> driver), by ``payload_bytes``. Weights or any other data routed through the driver,
by whatever method, therefore show in the trainer's ``perf/driver_bytes_*`` metrics.

Choices: ``local`` runs the one worker in this process (world size 1, no torch.distributed): the
default, the GPU machine's path, and the easiest to debug; its traffic is what would cross a process
boundary with Ray (nothing is copied in one process). ``ray`` (``ray_group.py``) places one Ray actor
per rank on a shared placement-group resource pool; Ray is imported only for it, so the local backend
works where Ray is not installed.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
import torch

from verl.config import Config
from verl.protocol import Batch

_NUMBERS = (int, float, bool, np.number, np.bool_)
P = ParamSpec("P")  # a worker method's parameters after self
R = TypeVar("R")  # what one rank's call returns


def payload_bytes(obj: Any) -> int:
    """Bytes of data in ``obj`` as a call argument or result carries it: tensors and numeric arrays at their
    element size, Python numbers 8, strings and bytes their length, ``None`` 0; Batches, dataclasses, dicts
    (keys and values), lists, tuples, sets and object arrays by their items; anything else its pickle size.
    A measure of payload (0 for nothing, growing with every tensor, array or token list passed), not of the
    exact bytes on the wire (framing and pickle's compact small ints differ)."""
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, _NUMBERS):
        return 8
    if isinstance(obj, str):
        return len(obj.encode())
    if isinstance(obj, bytes | bytearray):
        return len(obj)
    if isinstance(obj, np.ndarray):
        return obj.nbytes if obj.dtype != object else sum(payload_bytes(item) for item in obj.flat)
    if isinstance(obj, Batch):
        return payload_bytes(obj.tensors) + payload_bytes(obj.non_tensors) + payload_bytes(obj.meta)
    if isinstance(obj, dict):
        return sum(payload_bytes(key) + payload_bytes(value) for key, value in obj.items())
    if isinstance(obj, list | tuple | set | frozenset):
        return sum(8 if isinstance(item, _NUMBERS) else payload_bytes(item) for item in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(payload_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


@dataclasses.dataclass
class Traffic:
    """Payload bytes (``payload_bytes``) of a worker group's calls since the last ``WorkerGroup.take_traffic``."""

    to_workers: int = 0  # call arguments, counted once per rank that received them (Batch chunks, prompts)
    to_driver: int = 0  # results, summed over the ranks that returned them (log-probs, metrics, generated ids)

    @property
    def total(self) -> int:
        return self.to_workers + self.to_driver

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.to_workers + other.to_workers, self.to_driver + other.to_driver)

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.to_workers - other.to_workers, self.to_driver - other.to_driver)


class WorkerGroup:
    """The four calls of the module docstring over one backend primitive, ``_run``; every call is metered."""

    world_size: int
    worker_cls: type  # the class every rank's worker is an instance of

    def __init__(self) -> None:
        self.traffic = Traffic()
        self._traffic_lock = threading.Lock()  # calls to disjoint ranks may come from several threads

    def _run(self, name: str, args_per_rank: list[tuple], kwargs: dict[str, Any],
             ranks: list[int] | None = None) -> list:
        """Call the workers' method ``name(*args_per_rank[k], **kwargs)`` on rank ``ranks[k]`` (default: every
        rank), in parallel; the results in that order."""
        raise NotImplementedError

    def method_name(self, method: Callable) -> str:
        """The name the ranks call ``method`` by; TypeError unless it is a method of the workers' class (its own or
        inherited), so a call meant for another role fails here, naming both, before any rank runs it."""
        for cls in self.worker_cls.__mro__:
            name = next((name for name, value in vars(cls).items() if value is method), None)
            if name is not None:
                return name
        raise TypeError(f"{getattr(method, '__qualname__', method)!r} is not a method of "
                        f"{self.worker_cls.__name__}, the class of this group's workers")

    def _call(self, method: Callable, args_per_rank: list[tuple], kwargs: dict[str, Any] | None = None,
              ranks: list[int] | None = None) -> list:
        name = self.method_name(method)
        kwargs = kwargs or {}
        sent = sum(payload_bytes(args) + payload_bytes(kwargs) for args in args_per_rank)
        results = self._run(name, args_per_rank, kwargs, ranks)
        received = payload_bytes(results)
        with self._traffic_lock:
            self.traffic.to_workers += sent
            self.traffic.to_driver += received
        return results

    def execute_split(self, method: Callable[[Any, Batch], R], batch: Batch) -> R:
        """Call ``method`` on equal chunks of ``batch``, one per rank; concatenated Batch or rank 0's dict."""
        name = self.method_name(method)
        chunks = [batch] if self.world_size == 1 else split_for_ranks(name, batch, self.world_size)
        return combine(name, self._call(method, [(chunk,) for chunk in chunks]))

    def execute_all(self, method: Callable[Concatenate[Any, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Call ``method(*args, **kwargs)`` on every rank; the results in rank order."""
        return self._call(method, [args] * self.world_size, kwargs)

    def execute_each(self, method: Callable[..., R], args_per_rank: list[tuple]) -> list[R]:
        """Call ``method(*args_per_rank[r])`` on rank r, all ranks in parallel; the results in rank order."""
        check_args_per_rank(self.method_name(method), args_per_rank, self.world_size)
        return self._call(method, args_per_rank)

    def execute_ranks(self, method: Callable[Concatenate[Any, P], R], ranks: list[int], *args: P.args,
                      **kwargs: P.kwargs) -> list[R]:
        """Call ``method(*args, **kwargs)`` on each of ``ranks`` only, in parallel; the results in the order of
        ``ranks``."""
        if not ranks or any(not 0 <= r < self.world_size for r in ranks):
            raise ValueError(f"{self.method_name(method)}: ranks {ranks} are not a non-empty subset of "
                             f"0..{self.world_size - 1}")
        return self._call(method, [args] * len(ranks), kwargs, ranks=list(ranks))

    def take_traffic(self) -> Traffic:
        """The traffic since the previous call (then reset)."""
        with self._traffic_lock:
            traffic, self.traffic = self.traffic, Traffic()
        return traffic

    def shutdown(self) -> None:
        """Release the workers (and their processes, for Ray)."""


def split_for_ranks(method: str, batch: Batch, world_size: int) -> list[Batch]:
    """``batch`` in ``world_size`` equal consecutive chunks; ValueError naming the sizes otherwise."""
    if len(batch) % world_size:
        raise ValueError(f"{method}: a batch of {len(batch)} rows does not split into {world_size} equal parts "
                         f"(one per worker); make the batch size a multiple of the world size")
    return batch.chunk(world_size)


def check_args_per_rank(method: str, args_per_rank: list[tuple], world_size: int) -> None:
    if len(args_per_rank) != world_size:
        raise ValueError(f"{method}: got arguments for {len(args_per_rank)} ranks, the group has {world_size}")


def combine(method: str, results: list) -> Batch | dict:
    """Per-rank results -> the group's result: Batches concatenated in rank order, else rank 0's dict."""
    if all(isinstance(r, Batch) for r in results):
        return Batch.concat(results)
    if all(isinstance(r, dict) for r in results):
        return results[0]
    raise TypeError(f"{method} returned {[type(r).__name__ for r in results]}; execute_split needs Batch or dict")


class LocalWorkerGroup(WorkerGroup):
    """One worker in this process (world size 1)."""

    def __init__(self, worker_cls: type, cfg: Config, **init_kwargs: Any):
        super().__init__()
        self.world_size = 1
        self.worker_cls = worker_cls
        self.worker = worker_cls(cfg, **init_kwargs)

    def _run(self, name: str, args_per_rank: list[tuple], kwargs: dict[str, Any],
             ranks: list[int] | None = None) -> list:
        return [getattr(self.worker, name)(*args_per_rank[0], **kwargs)]

    def shutdown(self) -> None:
        self.worker = None
