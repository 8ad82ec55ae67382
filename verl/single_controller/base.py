"""The worker-group interface, the in-process backend and the factory over both backends.

A worker group holds ``world_size`` instances of one worker class (one data-parallel rank each).
The single controller (the trainer) drives it with two calls:

* ``execute_split(method, batch)``: split the batch into ``world_size`` equal consecutive chunks,
  call ``method(chunk)`` on every rank in parallel, and combine: ``Batch`` results are
  concatenated in rank order (so rows come back in input order); ``dict`` results (metrics,
  already all-reduced by the workers) are rank 0's.
* ``execute_all(method, *args, **kwargs)``: the same call on every rank, results in rank order
  (checkpoints, weight sync, export: collectives that every rank must enter).
* ``execute_each(method, args_per_rank)``: ``method(*args_per_rank[r])`` on rank r, in parallel,
  results in rank order (generation: each rank continues its own share of the rows).

Choices: ``local`` runs the one worker in this process (world size 1, no torch.distributed): the
default, the GPU machine's path, and the easiest to debug. ``ray`` (``ray_group.py``) places one
Ray actor per rank on a shared placement-group resource pool; Ray is imported only for it, so the
local backend works where Ray is not installed.
"""

from __future__ import annotations

from typing import Any, Protocol

from verl.config import Config
from verl.protocol import Batch


class WorkerGroup(Protocol):
    world_size: int

    def execute_split(self, method: str, batch: Batch) -> Batch | dict:
        """Call ``method`` on equal chunks of ``batch``, one per rank; concatenated Batch or rank 0's dict."""
        ...

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method(*args, **kwargs)`` on every rank; the results in rank order."""
        ...

    def execute_each(self, method: str, args_per_rank: list[tuple]) -> list:
        """Call ``method(*args_per_rank[r])`` on rank r, all ranks in parallel; the results in rank order."""
        ...

    def shutdown(self) -> None:
        """Release the workers (and their processes, for Ray)."""
        ...


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


class LocalWorkerGroup:
    """One worker in this process (world size 1)."""

    def __init__(self, worker_cls: type, cfg: Config, **init_kwargs: Any):
        self.world_size = 1
        self.worker = worker_cls(cfg, **init_kwargs)

    def execute_split(self, method: str, batch: Batch) -> Batch | dict:
        return combine(method, [getattr(self.worker, method)(batch)])

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        return [getattr(self.worker, method)(*args, **kwargs)]

    def execute_each(self, method: str, args_per_rank: list[tuple]) -> list:
        check_args_per_rank(method, args_per_rank, 1)
        return [getattr(self.worker, method)(*args_per_rank[0])]

    def shutdown(self) -> None:
        self.worker = None


def create_worker_group(worker_cls: type, cfg: Config, backend: str, world_size: int,
                        **init_kwargs: Any) -> WorkerGroup:
    """``world_size`` workers ``worker_cls(cfg, **init_kwargs)`` on ``backend`` (``local`` | ``ray``)."""
    if backend == "local":
        if world_size != 1:
            raise ValueError(f"trainer.backend=local runs one in-process worker; got world_size={world_size} "
                             "(use trainer.backend=ray for several)")
        return LocalWorkerGroup(worker_cls, cfg, **init_kwargs)
    if backend == "ray":
        from verl.single_controller.ray_group import RayWorkerGroup

        return RayWorkerGroup(worker_cls, cfg, world_size, **init_kwargs)
    raise ValueError(f"unknown worker-group backend {backend!r}: valid are local, ray")
