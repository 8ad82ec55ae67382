"""Ray backend: one Ray actor per rank, placed on a shared placement-group resource pool.

Choices:

* **Resource pool**: one placement group per (Ray job, world size) with ``world_size`` bundles of
  ``{"CPU": 1, "GPU": 1}`` (``{"CPU": 1}`` when the cluster has no GPU), strategy PACK, so
  ``trainer.nnodes x trainer.n_gpus_per_node`` bundles fill the nodes in order. A worker group puts
  rank i in bundle i and asks for a ``1 / MAX_COLOCATED`` share of it.
* **One process per rank for every role** (``colocate_with``): the critic and the reference are built
  inside the actor group's processes (verl's colocated worker), each role a named worker in the
  ``WorkerProcess``. Rank i of every role shares one device, one CUDA context and one process group, and
  the model libraries are imported once per rank instead of once per role (~5 s of start-up a role on
  CPU). The roles' calls come one at a time from the driver, so their collectives never interleave on
  the shared process group; only generation (no collectives) runs beside them when pipelined.
* **Disaggregated placement** (``trainer.rollout_ranks = N``): the pool has ``train + N`` bundles; the training
  groups take bundles ``[0, train)`` and the rollout group (engines only) bundles ``[train, train + N)``, so the
  two never share a device.
* **Process group**: the driver asks rank 0 for its node address and a free port; every actor
  sets ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``/``LOCAL_RANK`` and joins
  torch.distributed (nccl with a GPU, gloo on CPU) *before* building its worker, so the worker's
  FSDP2 sharding sees the group. Each set of processes (the training roles; the disaggregated rollout
  ranks) is its own process group.
* **Ray itself**: a cluster that ``RAY_ADDRESS`` names is joined (several nodes: ``ray start --head`` on one,
  ``ray start --address=...`` on the others; the pool's bundles then fill the nodes). Otherwise, unless the caller
  initialised Ray, a local instance is started with this machine's CPUs (at least one per worker) and no
  dashboard, to keep startup light.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.config import Config, ConfigError, import_plugins
from verl.single_controller.base import WorkerGroup
from verl.utils.ray_cluster import join_ray_cluster

logger = logging.getLogger(__name__)

MAX_COLOCATED = 4  # sets of processes that can share one bundle (the trainer needs one; others: worker groups of tests)
PLACEMENT_TIMEOUT_S = 120
_POOLS: dict[tuple[str, str, int], PlacementGroup] = {}


class RayUnreachable(ConfigError):
    """``RAY_ADDRESS`` names a cluster that does not answer within ``trainer.ray_timeout_s``."""


def ensure_ray(min_cpus: int, timeout_s: float) -> None:
    """Join the cluster ``RAY_ADDRESS`` names (``RayUnreachable`` if it does not answer within ``timeout_s``), or
    start a local Ray instance; nothing if Ray is initialised."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        join_cluster(os.environ["RAY_ADDRESS"], timeout_s)
    else:
        ray.init(num_cpus=max(os.cpu_count() or 1, min_cpus), include_dashboard=False)


def join_cluster(address: str, timeout_s: float) -> None:
    """``ray.init(address=...)`` that gives up after ``timeout_s`` with ``RayUnreachable``
    (``verl.utils.ray_cluster.join_ray_cluster``: Ray itself retries a cluster that is not there for ever)."""
    unreachable = (f"RAY_ADDRESS={address}: no Ray cluster answers there within {timeout_s:g}s "
                   "(trainer.ray_timeout_s); start one with `ray start --head` on that machine (and `ray start "
                   "--address=HEAD:PORT` on the others), or unset RAY_ADDRESS to run on a Ray instance started here")
    join_ray_cluster(address, timeout_s, unreachable, RayUnreachable)


def resource_pool(world_size: int) -> tuple[PlacementGroup, bool]:
    """The shared placement group of ``world_size`` bundles (created on first use); and whether it has GPUs."""
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    # The driver's node id differs between Ray instances (job ids restart at 1), so a pool of an
    # instance that was shut down is never reused.
    context = ray.get_runtime_context()
    key = (context.get_node_id(), context.get_job_id(), world_size)
    if key not in _POOLS:
        bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        pool = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK")
        try:
            ray.get(pool.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as err:
            remove_placement_group(pool)
            raise RuntimeError(f"could not place {world_size} bundles of {bundle} (trainer.nnodes x "
                               f"trainer.n_gpus_per_node) within {PLACEMENT_TIMEOUT_S}s; the cluster has "
                               f"{ray.cluster_resources()}") from err
        _POOLS[key] = pool
    return _POOLS[key], use_gpu


class WorkerProcess:
    """The Ray actor hosting one rank: joins the process group, then builds and serves that rank's worker of each
    role (actor, critic, reference: ``colocate_with``) under the role's name."""

    def __init__(self):
        self.workers: dict[str, Any] = {}

    def address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port on it (rank 0 serves the process-group rendezvous)."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def init_distributed(self, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=master_addr,
                          MASTER_PORT=str(master_port), LOCAL_RANK="0")  # Ray shows each actor only its GPU
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=rank, world_size=world_size)

    def build(self, role: str, worker_cls: type, cfg: Config, init_kwargs: dict[str, Any]) -> None:
        import_plugins(cfg.plugins)  # what they register (a policy loss, a KL estimator) is needed here too
        self.workers[role] = worker_cls(cfg, **init_kwargs)

    def execute(self, role: str, name: str, *args: Any, **kwargs: Any) -> Any:
        """Role ``role``'s worker method ``name`` (``WorkerGroup.method_name`` checked it on the driver)."""
        return getattr(self.workers[role], name)(*args, **kwargs)


class RayWorkerGroup(WorkerGroup):
    """``world_size`` Ray actors, each one data-parallel rank of ``worker_cls``; with ``colocate_with`` (a group of
    the same size and bundles), built inside that group's actors instead of new ones."""

    def __init__(self, worker_cls: type, cfg: Config, world_size: int, max_concurrency: int = 1,
                 pool_size: int | None = None, first_bundle: int = 0, colocate_with: RayWorkerGroup | None = None,
                 **init_kwargs: Any):
        super().__init__()
        self.world_size = world_size
        self.worker_cls = worker_cls
        self.role = worker_cls.__name__
        self.owns_processes = colocate_with is None
        if colocate_with is not None:
            if (colocate_with.world_size, colocate_with.first_bundle) != (world_size, first_bundle):
                raise ValueError(f"{self.role} cannot share the processes of {colocate_with.role}: {world_size} "
                                 f"ranks from bundle {first_bundle} against {colocate_with.world_size} from "
                                 f"{colocate_with.first_bundle}")
            if self.role in colocate_with.roles:
                raise ValueError(f"{colocate_with.role}'s processes already host a {self.role}")
            self.workers, self.roles, use_gpu = colocate_with.workers, colocate_with.roles, colocate_with.use_gpu
        else:
            pool_size = world_size if pool_size is None else pool_size
            ensure_ray(pool_size, cfg.trainer.ray_timeout_s)
            pool, use_gpu = resource_pool(pool_size)
            share = 1.0 / MAX_COLOCATED
            actor_cls = ray.remote(WorkerProcess)
            self.workers = [
                actor_cls.options(num_cpus=share, num_gpus=share if use_gpu else 0, max_concurrency=max_concurrency,
                                  scheduling_strategy=PlacementGroupSchedulingStrategy(pool, first_bundle + rank)
                                  ).remote()
                for rank in range(world_size)
            ]
            self.roles: set[str] = set()
            master_addr, master_port = ray.get(self.workers[0].address.remote())
            ray.get([w.init_distributed.remote(rank, world_size, master_addr, master_port)
                     for rank, w in enumerate(self.workers)])
        self.first_bundle, self.use_gpu = first_bundle, use_gpu
        ray.get([w.build.remote(self.role, worker_cls, cfg, init_kwargs) for w in self.workers])
        self.roles.add(self.role)
        self.node_ids = ray.get([w.node_id.remote() for w in self.workers])  # rank -> Ray node id
        logger.info("%s: %d Ray workers on %s, %d node(s): %s%s", self.role, world_size,
                    "GPUs" if use_gpu else "CPUs", len(set(self.node_ids)), ", ".join(n[:8] for n in self.node_ids),
                    "" if colocate_with is None else f" (in {colocate_with.role}'s processes)")

    def _run(self, name: str, args_per_rank: list[tuple], kwargs: dict[str, Any],
             ranks: list[int] | None = None) -> list:
        workers = self.workers if ranks is None else [self.workers[r] for r in ranks]
        return ray.get([w.execute.remote(self.role, name, *args, **kwargs)
                        for w, args in zip(workers, args_per_rank, strict=True)])

    def shutdown(self) -> None:
        """Kill the processes if this group started them (a colocated role's go with its host's)."""
        if self.owns_processes:
            for worker in self.workers:
                ray.kill(worker)
        self.workers = []
