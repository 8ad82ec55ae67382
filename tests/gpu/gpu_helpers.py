"""Shared by the GPU tier's tests: where they run, and what the driver says a process holds of the GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from verl.workers.device_holders import query_compute_apps

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: the GPU_TESTS_DEVICE=cpu trial (tests/conftest.py)
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU: reads the driver's memory accounting "
                                                        "(skipped in the CPU trial too)")


def driver_held_bytes(pid: int) -> int:
    """Bytes of all GPUs that the driver accounts to process ``pid`` (0: none; the tests that call this are
    ``cuda_only``, so a driver is there to ask)."""
    holders = query_compute_apps()
    assert holders is not None, "nvidia-smi --query-compute-apps failed on a machine with a CUDA device"
    return sum(h.used_bytes or 0 for h in holders if h.pid == pid)


@contextlib.contextmanager
def forward_widths(model: torch.nn.Module) -> Iterator[list[int]]:
    """Inside: the batch width (rows of ``input_ids``) of each forward pass of ``model``, in order."""
    widths: list[int] = []

    def record(_module, _args, kwargs) -> None:
        widths.append(kwargs["input_ids"].shape[0])

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield widths
    finally:
        handle.remove()
