"""Other processes that already hold memory of this run's GPUs, named at start-up (issue 56).

A run that shares its GPU with a process holding most of it (a retrieval service whose JAX preallocated 105 GiB of
an H200) used to die with a CUDA out-of-memory traceback at its first optimizer step, minutes in. At start-up the
trainer now names each such process: "process PID (its command) holds X GiB of cuda:0", and warns when this run's
expected memory does not fit in what the others leave.

Choices:
- The driver's per-process accounting, read with ``nvidia-smi --query-compute-apps`` (the tool ships with the
  driver; no Python binding needed), is the only source that sees other processes' memory. Where there is no
  NVIDIA driver or ``nvidia-smi`` fails, the check is skipped (logged at debug level): nothing to warn about.
- A run's devices are matched to the driver's GPUs by UUID (``torch.cuda.get_device_properties(i).uuid``), which
  ``CUDA_VISIBLE_DEVICES`` renumbering cannot confuse; torch prints it without nvidia-smi's ``GPU-`` prefix.
- What is left for the run is the device's total memory minus what the other processes hold (nothing is allocated
  here to measure it). The devices checked are the run's own: the current device with the local backend, every
  device this process sees with Ray (which places the ranks on them).
- This process, and the processes the caller names (its own workers), are not "other".
"""

from __future__ import annotations

import csv
import io
import logging
import os
import subprocess
from dataclasses import dataclass

logger = logging.getLogger(__name__)

GIB = 1 << 30
QUERY = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class DeviceHolder:
    """One process's memory on one GPU, as the driver accounts it; ``used_bytes`` None where the driver does not say
    (``[N/A]``, e.g. a process of another container)."""

    gpu_uuid: str
    pid: int
    used_bytes: int | None


def normalise_uuid(uuid: str) -> str:
    """``GPU-8d6b...`` (nvidia-smi) and ``8d6b...`` (torch) -> ``8d6b...``, lower case."""
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def parse_compute_apps(text: str) -> list[DeviceHolder]:
    """Rows of ``QUERY``'s output (``gpu_uuid, pid, used_memory`` in MiB, no header) -> holders. Blank lines and the
    driver's "No running processes found" are no rows; a row that is not three fields, or whose pid is not a number,
    is a ``ValueError`` naming it."""
    holders = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not row or not "".join(row).strip() or row[0].startswith("No running"):
            continue
        if len(row) != 3 or not row[1].strip().isdigit():
            raise ValueError(f"nvidia-smi --query-compute-apps gave a row that is not gpu_uuid, pid, used_memory: "
                             f"{','.join(row)!r}")
        uuid, pid, used = (field.strip() for field in row)
        used_bytes = int(float(used) * (1 << 20)) if used.replace(".", "", 1).isdigit() else None
        holders.append(DeviceHolder(normalise_uuid(uuid), int(pid), used_bytes))
    return holders


def query_compute_apps() -> list[DeviceHolder] | None:
    """The driver's per-process GPU memory, or None where it cannot be read (no ``nvidia-smi``, no driver, an
    error)."""
    try:
        done = subprocess.run(QUERY, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.debug("no per-process GPU memory (%s): not checked", e)
        return None
    if done.returncode != 0:
        logger.debug("no per-process GPU memory (nvidia-smi exit %d: %s): not checked", done.returncode,
                     done.stdout.strip() or done.stderr.strip())
        return None
    return parse_compute_apps(done.stdout)


def command_of(pid: int) -> str:
    """The process's command line, shortened (``/proc``; empty where this process cannot see it, e.g. another
    container's)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return ""
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return text if len(text) <= 100 else text[:97] + "..."


def others_message(holders: list[DeviceHolder], devices: dict[str, tuple[str, int]], need_bytes: float,
                   own_pids: set[int], commands: dict[int, str] | None = None) -> tuple[str, bool] | None:
    """The start-up message about ``holders`` on this run's ``devices`` (normalised UUID -> (name such as ``cuda:0``,
    total bytes)) other than ``own_pids``, for a run expecting ``need_bytes`` per device -> (message, whether the run
    likely does not fit), or None where no other process holds any of them. ``commands``: pid -> command line (read
    from /proc where not given)."""
    others = [h for h in holders if h.gpu_uuid in devices and h.pid not in own_pids]
    if not others:
        return None
    commands = commands if commands is not None else {h.pid: command_of(h.pid) for h in others}
    lines, short = [], False
    for uuid, (name, total) in devices.items():
        here = [h for h in others if h.gpu_uuid == uuid]
        if not here:
            continue
        held = sum(h.used_bytes or 0 for h in here)
        for h in here:
            amount = "an amount the driver does not report" if h.used_bytes is None else f"{h.used_bytes / GIB:.1f} GiB"
            command = f" ({commands[h.pid]})" if commands.get(h.pid) else ""
            lines.append(f"process {h.pid}{command} holds {amount} of {name}")
        left = total - held
        short |= need_bytes > left
        lines.append(f"  {name}: {left / GIB:.1f} of {total / GIB:.1f} GiB left for this run, which expects about "
                     f"{need_bytes / GIB:.1f} GiB per device")
    if short:
        lines.append("the run will likely stop with CUDA out of memory (at its first optimizer step at the latest): "
                     "stop those processes or keep them off this GPU (a retrieval service of this project stays off "
                     "the GPUs unless given --encoder-device cuda or --faiss-gpu; JAX in another process: "
                     "XLA_PYTHON_CLIENT_PREALLOCATE=false), or make the run smaller (see the estimate above)")
    return "\n".join(lines), short


def report_other_holders(need_bytes: float, backend: str, own_pids: set[int] | None = None) -> str | None:
    """Log which other processes hold memory of this run's CUDA devices (``backend`` local: the current device; ray:
    every visible one), a warning when the run's ``need_bytes`` per device does not fit in what they leave, else
    info -> the message, or None (no other process there, or no driver to ask)."""
    holders = query_compute_apps()
    if not holders:
        return None
    import torch

    device_indices = [torch.cuda.current_device()] if backend == "local" else list(range(torch.cuda.device_count()))
    devices = {}
    for index in device_indices:
        props = torch.cuda.get_device_properties(index)
        devices[normalise_uuid(str(props.uuid))] = (f"cuda:{index}", int(props.total_memory))
    found = others_message(holders, devices, need_bytes, {os.getpid(), *(own_pids or set())})
    if found is None:
        return None
    message, short = found
    logger.log(logging.WARNING if short else logging.INFO, "%s", message)
    return message
