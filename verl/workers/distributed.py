"""Devices and processes: this rank and the world, collectives, FSDP2 sharding and gathering the full weights.

Choices:

* **Sharding.** With ``torch.distributed`` initialised and world size > 1, each decoder layer (the
  classes the model lists in ``_no_split_modules``) and then the root are wrapped with FSDP2
  ``fully_shard`` on a 1-D mesh (gloo on CPU, nccl on GPU). Every rank seeds identically before
  building, so the shards come from one initialisation.
* **Collectives** go over the default group; on nccl a CPU tensor is copied to this process's GPU and back. In a
  single process they are no-ops.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard


def world() -> tuple[int, int]:
    """(rank, world_size) of the default process group; (0, 1) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_(x: Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Tensor:
    """In-place all-reduce over the default group (through the GPU under nccl); a no-op in a single
    process. Returns ``x``."""
    if world()[1] > 1:
        on_gpu = dist.get_backend() == "nccl"
        y = x.to(torch.device("cuda", torch.cuda.current_device())) if on_gpu else x
        dist.all_reduce(y, op=op)
        x.copy_(y)
    return x


def init_single_process_group(device: torch.device) -> None:
    """A torch.distributed world of this process alone, unless one exists (FSDP2 needs a process group)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def shard_model(model: nn.Module, device: torch.device, offload: bool = False) -> None:
    """FSDP2: ``fully_shard`` every decoder layer, then the root (embeddings, head, tied weights);
    with ``offload`` the shards live in host memory (``CPUOffloadPolicy``)."""
    mesh = init_device_mesh(device.type, (world()[1],))
    policy = {"offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")} if offload else {}
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"{type(model).__name__} lists no decoder layer classes in _no_split_modules; "
                         "cannot shard it layer by layer")
    for layer in layers:
        fully_shard(layer, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)


def gather_full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """HF-named full weights as CPU tensors. Sharded models gather them (a collective: call on every
    rank); the full dict is returned on rank 0 and ``{}`` on other ranks."""
    if isinstance(model, FSDPModule):
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}
