"""Which device each part of the retrieval service runs on, and how much device memory it took there.

Choices:
- Nothing goes on a GPU unless asked. The query encoder and the re-ranker run on ``--encoder-device`` (default
  ``cpu``); a dense index goes to the GPUs only with ``--faiss-gpu shard|replicate`` (default ``off``); BM25 always
  searches on the CPU. A trainer usually shares the machine's GPUs with the service, and a service that took a GPU
  it was not given made the trainer run out of memory (issue 56).
- JAX stays out of the service. ``bm25s`` imports ``jax.lax`` when it is imported, if JAX is installed, and runs a
  top-k with it at once (``bm25s/selection.py``), which starts JAX's GPU backend; JAX then preallocates 75 % of the
  first GPU (105 GiB of an H200, issue 56), although our BM25 search uses bm25s's numba kernels and never JAX.
  ``index/bm25.py`` imports bm25s under ``jax_hidden``, which makes that import fail as if JAX were not installed (a
  ``None`` entry in ``sys.modules``: Python raises ImportError without searching the path), so bm25s records JAX as
  unavailable (a BM25 build is covered too). ``keep_jax_off_devices`` (called first by the service's ``main``) also
  sets ``JAX_PLATFORMS=cpu`` and ``XLA_PYTHON_CLIENT_PREALLOCATE=false``, which JAX reads when it starts a backend,
  for any other library of the service (or a child process) that might start JAX: it would stay on the CPU.
- ``CUDA_VISIBLE_DEVICES`` is honoured as torch and FAISS honour it (an empty value: no GPU; ``cuda:0`` is the first
  device it lists). A device asked for that this process cannot see is refused before the port is bound, and the
  message names the variable's value.
- What a part took of a GPU is the fall of that device's free memory (cudaMemGetInfo, through torch) while the part
  loaded: the first part on a device also counts the CUDA context the process creates there (a few hundred MiB), and
  another process allocating on the device at the same moment would be counted too. A CPU part takes none.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

GIB = 1 << 30
# JAX reads these when it starts a backend: CPU only, and no preallocation of a device (see the module docstring).
JAX_ENV = {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")


def keep_jax_off_devices() -> None:
    """Set ``JAX_ENV`` in this process's environment (and so its children's), keeping values the user set."""
    for name, value in JAX_ENV.items():
        os.environ.setdefault(name, value)


def check_device_name(flag: str, device: str) -> str:
    """``device`` as torch names it (``cpu``, ``cuda:N``; ``cuda`` means ``cuda:0``); ``ValueError`` naming ``flag``
    and what is allowed otherwise."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise ValueError(f"{flag} must be cpu, cuda or cuda:N (N: a device index as CUDA_VISIBLE_DEVICES numbers "
                         f"them from 0), got {device!r}")
    return "cuda:0" if device == "cuda" else device


def visible_gpus_note() -> str:
    """How this process's GPUs are chosen, for messages: the value of ``CUDA_VISIBLE_DEVICES`` or that it is unset."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return "CUDA_VISIBLE_DEVICES is unset: every GPU of the machine is visible"
    return f"CUDA_VISIBLE_DEVICES={value!r}" + (": no GPU is visible" if not value.strip() else "")


def check_cuda_device(flag: str, device: str) -> None:
    """``ValueError`` naming ``flag``, the visible device count and ``CUDA_VISIBLE_DEVICES`` when ``device``
    (``cuda:N``) is not a device this process can use; nothing to check for ``cpu``."""
    if device == "cpu":
        return
    import torch  # only when a GPU is asked for: a CPU service never needs it for this

    index = int(device.split(":")[1])
    if not torch.cuda.is_available():
        why = f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None else \
            "torch sees no CUDA device"
        raise ValueError(f"{flag} {device}: no GPU can be used here: {why} ({visible_gpus_note()}); use {flag} cpu")
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"{flag} {device}: this process sees {count} CUDA device(s), cuda:0 to cuda:{count - 1} "
                         f"({visible_gpus_note()})")


@dataclass
class Placement:
    """Where one part of the service (``index``, ``encoder``, ``reranker``) runs: ``device`` is ``cpu``, ``cuda:N``,
    or several devices joined by commas (a FAISS index sharded or replicated over GPUs; ``how`` says which);
    ``device_bytes`` is the device memory it took while loading (0 on the CPU; None before it is loaded)."""

    part: str
    device: str
    how: str = ""
    device_bytes: int | None = None

    def as_dict(self) -> dict:
        gib = None if self.device_bytes is None else round(self.device_bytes / GIB, 3)
        return {"device": self.device, "how": self.how or None, "device_memory_gib": gib}

    def describe(self) -> str:
        """``index on cuda:0,cuda:1 (shard), 2.10 GiB of device memory`` / ``encoder on cpu``."""
        text = f"{self.part} on {self.device}" + (f" ({self.how})" if self.how else "")
        if self.device_bytes and self.device != "cpu":
            text += f", {self.device_bytes / GIB:.2f} GiB of device memory"
        return text


def describe_placements(placements: list[Placement]) -> str:
    """One line for the log: each part's device (and device memory once loaded); ``no encoder`` etc. for the parts
    this service does not have."""
    parts = {p.part: p for p in placements}
    return "; ".join(parts[name].describe() if name in parts else f"no {name}"
                     for name in ("index", "encoder", "reranker"))


def cuda_indices(device: str) -> list[int]:
    """The CUDA device indices of a ``Placement.device`` (``cpu``: none)."""
    return [int(d.split(":")[1]) for d in device.split(",") if d.startswith("cuda:")]


def used_device_bytes(indices: list[int]) -> int:
    """Memory in use on the CUDA devices ``indices`` (all processes): total minus free, summed; 0 for none."""
    if not indices:
        return 0
    import torch

    return sum(total - free for free, total in (torch.cuda.mem_get_info(i) for i in indices))


@contextlib.contextmanager
def measured(placement: Placement) -> Iterator[Placement]:
    """Load the part inside; on leaving, ``placement.device_bytes`` is what its devices' used memory grew by (0 on
    the CPU). Set ``placement.device`` inside when the loader decides it (a FAISS index that stays on the CPU)."""
    before = {i: used_device_bytes([i]) for i in cuda_indices(placement.device)}
    yield placement
    after = {i: used_device_bytes([i]) for i in cuda_indices(placement.device)}
    placement.device_bytes = max(0, sum(after[i] - before.get(i, after[i]) for i in after))
