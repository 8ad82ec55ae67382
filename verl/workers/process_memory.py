"""This process's memory: peaks measured per step, and the host allocator's rules for a model trained on the host.

Choices:

* **Peaks per step.** ``peak_memory_metrics`` reports, then resets, the most memory a step took: on a GPU torch's
  allocated peak, on the host the kernel's resident high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs``), beside the process's lifetime peak and its resident set now.
* **Freed host memory is kept for reuse within a step** (``trainer.host_memory=reuse``, the default:
  ``keep_freed_host_memory``, then ``release_host_memory`` after each optimiser step): every block comes from glibc's
  heap and nothing freed is handed back until the step ends, so the next micro-batch's tensors land on pages already
  mapped. A fresh page costs a fault and the kernel zeroing it; on a 2-core host that was 40 % of the actor's update
  (docs/history/results-journal.md, "Freed host memory kept for reuse"). Handing the free pages back once a step
  keeps the resident set from creeping: never trimmed, the heap's holes grew it by about 0.2 GiB a step. Kept
  memory is a cache, so it goes back whenever the host runs short (``FreedMemoryGuard``: a thread that trims when
  less than ``HOST_MEMORY_RESERVE`` of the host's memory is available). Within a step nothing else bounds it: on the
  paper table's GRPO settings (4-row micro-batches of rows up to 1,680 tokens) a step's peak grew from 10 to 19.4 GiB
  over 11 steps, 1.8x the step's estimate, where release's peaks stayed under it.
* Or **freed host pages go back after each micro-batch** (``trainer.host_memory=release``: ``release_host_memory``,
  glibc's ``malloc_trim``, and **large host allocations mapped on their own**, ``map_large_host_allocations``, glibc's
  ``M_MMAP_THRESHOLD``): the resident set follows each phase's own peak instead of the sum of the phases' peaks
  (docs/results.md, "Memory over a run"), at the price of those page faults.
* All of them are no-ops where there is no glibc, and a setting the user made in the environment is kept.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import resource
import threading
import time
from collections.abc import Callable

import torch

_lifetime_peak_kib = 0  # the process's peak resident set before the last high-water-mark reset


def peak_memory_metrics(device: torch.device) -> dict[str, float]:
    """This rank's peak memory since the previous call (one training step when called once per step), then reset:
    on a GPU the most allocated (``perf/max_memory_allocated_gb``); on the host the peak resident set
    (``perf/step_max_rss_gb``, Linux: the kernel's high-water mark, reset through ``/proc/self/clear_refs``).
    Also the process's peak resident set since it started (``perf/max_rss_gb``, never reset) and its resident set
    now (``perf/rss_gb``: what the allocator keeps between steps), and under ``reuse`` the trims the host's shortage
    forced (``perf/host_memory_trims``, ``FreedMemoryGuard``)."""
    global _lifetime_peak_kib
    # the kernel's peak (also what getrusage reports) since the last reset here; the lifetime peak is kept apart
    _lifetime_peak_kib = max(_lifetime_peak_kib, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    status = _proc_status()
    if "VmHWM" in status:
        # the kernel's counters are approximate (per-CPU): VmRSS was seen a few pages above VmHWM in one read; a
        # peak is never below what is resident now
        step_peak = max(status["VmHWM"], status["VmRSS"])
        _lifetime_peak_kib = max(_lifetime_peak_kib, step_peak)
        metrics = {"perf/max_rss_gb": _lifetime_peak_kib / (1 << 20),  # KiB -> GiB
                   "perf/step_max_rss_gb": step_peak / (1 << 20), "perf/rss_gb": status["VmRSS"] / (1 << 20)}
        _reset_high_water_mark()
    else:
        metrics = {"perf/max_rss_gb": _lifetime_peak_kib / (1 << 20)}
    guard = FreedMemoryGuard._started
    if guard is not None:  # trainer.host_memory=reuse: the trims the host's shortage forced since the previous call
        metrics["perf/host_memory_trims"], guard.reported = guard.trims - guard.reported, guard.trims
    if device.type == "cuda":
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / (1 << 30)
        torch.cuda.reset_peak_memory_stats(device)
    return metrics


def release_host_memory() -> None:
    """Give the host allocator's free pages back to the system (glibc's ``malloc_trim(0)``, every arena); a no-op
    where there is none. Freed tensors of one size rarely fit the next micro-batch's other sizes, and the generation
    thread's arena is not reused by the training thread's, so without it the resident set grows to the sum of the
    phases' peaks (measured: docs/results.md, "Memory over a run")."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


@functools.cache
def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function ``name``, or None where there is no glibc (or no such function)."""
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameter numbers
HOST_MMAP_THRESHOLD = 1 << 20  # bytes
HOST_MEMORY_MODES = ("reuse", "release")  # trainer.host_memory
_USER_TUNABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def _user_tuned() -> bool:
    """Whether the environment sets glibc's malloc tunables (``MALLOC_*_`` or ``glibc.malloc`` in ``GLIBC_TUNABLES``);
    the user's choice is then kept."""
    return any(name in os.environ for name in _USER_TUNABLES) or "malloc" in os.environ.get("GLIBC_TUNABLES", "")


def apply_host_memory(mode: str) -> bool:
    """Set this process's host allocator for ``trainer.host_memory`` = ``mode`` (``HOST_MEMORY_MODES``); True when
    set (False without glibc, or when the user set its tunables). ``release`` also asks its caller to hand free pages
    back after each micro-batch (``release_host_memory``)."""
    if mode not in HOST_MEMORY_MODES:
        raise ValueError(f"trainer.host_memory={mode!r}: expected one of {', '.join(HOST_MEMORY_MODES)}")
    if mode == "release":
        return map_large_host_allocations()
    kept = keep_freed_host_memory()
    if kept:
        FreedMemoryGuard.start_once()
    return kept


HOST_MEMORY_RESERVE = 0.25  # the share of the host's memory (or of its cgroup's limit) FreedMemoryGuard keeps free


class FreedMemoryGuard(threading.Thread):
    """Under ``reuse``: hands the freed pages back (``release_host_memory``) whenever less than ``reserve`` bytes of
    the host's memory are available (``host_available_bytes``), checked every ``interval`` seconds, at most one trim
    a ``pause`` (live memory above the line leaves nothing to free, and a trim holds the allocator's locks). So a run
    keeps its freed memory where the host has room and follows release's resident set where it has not, without
    knowing what else runs there (a second run, the retrieval service, the evaluation). A daemon thread; it reads
    ``/proc/meminfo`` (about 10 us) and calls glibc without the GIL (ctypes releases it)."""

    _started: FreedMemoryGuard | None = None
    _lock = threading.Lock()

    def __init__(self, reserve: float, interval: float = 0.1, pause: float = 1.0) -> None:
        super().__init__(name="freed-memory-guard", daemon=True)
        self.reserve, self.interval, self.pause = reserve, interval, pause
        self.trims = self.reported = 0  # trims made; those peak_memory_metrics has reported

    @classmethod
    def start_once(cls, share: float = HOST_MEMORY_RESERVE) -> FreedMemoryGuard | None:
        """The process's guard, started at the first call (``share`` of the host's memory kept available); None where
        the host's memory cannot be read."""
        with cls._lock:
            if cls._started is None and host_total_bytes():
                cls._started = cls(share * host_total_bytes())
                cls._started.start()
            return cls._started

    def run(self) -> None:
        last = -math.inf
        while True:
            time.sleep(self.interval)
            if time.monotonic() - last >= self.pause and host_available_bytes() < self.reserve:
                release_host_memory()
                last, self.trims = time.monotonic(), self.trims + 1


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2's "max": no limit


CGROUP_ROOT = "/sys/fs/cgroup"  # where this process's memory cgroup is read (cgroup v2's or v1's memory controller)


@functools.cache
def _cgroup_files() -> tuple[int, str, str, str] | None:
    """(limit, usage file, stat file, its inactive-file key) of this process's memory cgroup when it sets a limit
    below the host's memory (v2, then v1); None otherwise. Read once: a limit does not change under a run."""
    for limit, usage, stat, inactive in (("memory.max", "memory.current", "memory.stat", "inactive_file"),
                                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                          "memory/memory.stat", "total_inactive_file")):
        cap = _read_int(f"{CGROUP_ROOT}/{limit}")
        if cap is not None and cap < _meminfo("MemTotal") and _read_int(f"{CGROUP_ROOT}/{usage}") is not None:
            return cap, f"{CGROUP_ROOT}/{usage}", f"{CGROUP_ROOT}/{stat}", inactive
    return None


def _cgroup_available() -> int | None:
    """What this process's memory cgroup's limit leaves (its inactive file pages counted as free); None: no limit."""
    files = _cgroup_files()
    if files is None:
        return None
    cap, usage, stat, inactive = files
    try:
        with open(stat) as f:
            cache = next((int(line.split()[1]) for line in f if line.split()[0] == inactive), 0)
    except OSError:
        cache = 0
    return cap - (_read_int(usage) or 0) + cache


def _meminfo(key: str) -> int:
    """``key``'s bytes in /proc/meminfo (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":")), 0)
    except OSError:
        return 0


def host_total_bytes() -> int:
    """The host's memory, or its memory cgroup's limit when lower; 0 where unknown."""
    files = _cgroup_files()
    return files[0] if files else _meminfo("MemTotal")


def host_available_bytes() -> int:
    """Memory this process could still take: the kernel's ``MemAvailable``, or what its cgroup's limit leaves when
    that is less."""
    available, limited = _meminfo("MemAvailable"), _cgroup_available()
    return available if limited is None else min(available, limited)


def keep_freed_host_memory() -> bool:
    """Serve every host allocation from glibc's heap (``M_MMAP_MAX`` 0: no block mapped on its own, so none is unmapped
    when freed) and never trim the heap's free top by itself (``M_TRIM_THRESHOLD`` at its maximum; the caller hands
    free pages back when it chooses, ``release_host_memory``); True when set. Freed memory then serves the next
    allocations without a page fault or the kernel zeroing a fresh page. A block larger than a
    thread arena's 64 MiB heap is served by the main heap (glibc retries there). Left alone where glibc is absent or
    the user set malloc tunables in the environment."""
    if _user_tuned():
        return False
    mallopt = _glibc("mallopt")
    # mallopt takes an int; glibc stores the trim threshold as a size_t, so -1 is its maximum (never trim)
    return mallopt is not None and mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, -1) == 1


def map_large_host_allocations(threshold: int = HOST_MMAP_THRESHOLD) -> bool:
    """Serve every host allocation of ``threshold`` bytes or more from its own mapping, unmapped when freed (glibc's
    ``mallopt(M_MMAP_THRESHOLD)``); True when set. glibc raises its threshold to the size of each mapped block freed
    (up to 32 MiB), so after the first freed activations every tensor below 32 MiB comes from the heap, where one
    micro-batch's freed tensors leave holes the next one's sizes do not fit, and a step's peak grows by what the holes
    hold (measured on the real model: 7.8 -> 6.4 GiB on the same batches; docs/results.md, "Memory over a run"). A
    fixed threshold also stops the raise. Left alone where glibc is absent or the user set malloc tunables in the
    environment (``MALLOC_MMAP_THRESHOLD_`` and the like, or ``glibc.malloc`` in ``GLIBC_TUNABLES``)."""
    if _user_tuned():
        return False
    mallopt = _glibc("mallopt")
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, threshold) == 1



def _proc_status() -> dict[str, int]:
    """VmHWM / VmRSS of this process in KiB (Linux /proc/self/status; empty elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            return {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith(("VmHWM", "VmRSS"))}
    except OSError:
        return {}


def _reset_high_water_mark() -> None:
    """Reset VmHWM to the current resident set (Linux >= 4.0: writing 5 to clear_refs); silently kept elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass
