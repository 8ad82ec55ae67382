"""Worker groups: one interface over in-process workers (``local``, ``base.LocalWorkerGroup``) and Ray actors (``ray``,
``ray_group.RayWorkerGroup``); ``create_worker_group`` picks one by ``trainer.backend``. The factory lives here, above
both, so that ``ray_group`` builds on ``base`` and ``base`` never names ``ray_group`` (no import circle). The trainer
calls a group through its role's typed proxy (``roles.py``), the engines through ``rollout.GroupRollout``."""

from __future__ import annotations

from typing import Any

from verl.config import Config
from verl.single_controller.base import LocalWorkerGroup, WorkerGroup

__all__ = ["WorkerGroup", "create_worker_group"]


def create_worker_group(worker_cls: type, cfg: Config, backend: str, world_size: int, max_concurrency: int = 1,
                        pool_size: int | None = None, first_bundle: int = 0, colocate_with: WorkerGroup | None = None,
                        **init_kwargs: Any) -> WorkerGroup:
    """``world_size`` workers ``worker_cls(cfg, **init_kwargs)`` on ``backend`` (``local`` | ``ray``).

    ``max_concurrency``: calls a rank may run at once (Ray: a threaded actor; the pipelined rollout generates on a
    rank while it trains). The in-process worker runs whatever thread calls it. Ray: ranks take bundles
    ``first_bundle ..`` of the shared pool of ``pool_size`` (default ``world_size``) bundles. ``colocate_with``: a
    group whose processes host this one's workers too (Ray: one process per rank for actor, critic and reference;
    in-process workers all live in this process anyway)."""
    if backend == "local":
        if world_size != 1:
            raise ValueError(f"trainer.backend=local runs one in-process worker; got world_size={world_size} "
                             "(use trainer.backend=ray for several)")
        return LocalWorkerGroup(worker_cls, cfg, **init_kwargs)
    if backend == "ray":
        from verl.single_controller.ray_group import RayWorkerGroup  # Ray is imported only for this backend

        return RayWorkerGroup(worker_cls, cfg, world_size, max_concurrency=max_concurrency, pool_size=pool_size,
                              first_bundle=first_bundle, colocate_with=colocate_with, **init_kwargs)
    raise ValueError(f"unknown worker-group backend {backend!r}: valid are local, ray")
