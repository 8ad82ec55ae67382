"""The host-side memory helpers: the per-step peak (``peak_memory_metrics``) and handing freed pages back
(``release_host_memory``). Each runs in a fresh process, so the allocator's state is this test's own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.slow,  # a fresh process each
              pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")]


def run(code: str) -> list[float]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [float(x) for x in done.stdout.split()]


def test_release_host_memory_returns_freed_tensors_pages():
    """Guards against the resident set keeping every freed micro-batch: 600 MiB of 2 MiB tensors, freed while a
    later one stays alive (so the heap's top cannot shrink by itself), stay resident until the release."""
    before, freed, released = run("""
        import torch
        from verl.workers.memory import resident_bytes
        from verl.workers.process_memory import release_host_memory
        resident_gib = lambda: resident_bytes() / (1 << 30)
        x = torch.ones(1 << 20)  # a freed 4 MiB block raises glibc's mmap threshold: 2 MiB blocks then share the heap
        del x
        base = resident_gib()
        blocks = [torch.ones(1 << 19) for _ in range(300)]
        keep = torch.ones(1 << 19)
        del blocks
        freed = resident_gib()
        release_host_memory()
        print(base, freed, resident_gib())
    """)
    assert freed - before > 0.4, (before, freed)  # glibc kept the pages: what the release is for
    assert freed - released > 0.4, (freed, released)


def test_step_peak_is_reset_after_each_read():
    """Guards against a per-step peak that is the process's lifetime peak (never reset): a 1 GiB tensor in the
    first 'step' shows in that step's peak only."""
    first, second, lifetime = run("""
        import torch
        from verl.workers.process_memory import peak_memory_metrics
        device = torch.device("cpu")
        peak_memory_metrics(device)
        x = torch.ones(1 << 28); del x  # 1 GiB, touched, freed (mmapped: given back at once)
        one = peak_memory_metrics(device)
        two = peak_memory_metrics(device)
        print(one["perf/step_max_rss_gb"], two["perf/step_max_rss_gb"], two["perf/max_rss_gb"])
    """)
    assert first - second > 0.9 and lifetime >= first, (first, second, lifetime)


def test_large_host_allocations_are_mapped_and_given_back_when_freed():
    """Guards against the heap holding freed activations (what made a real-model step's peak grow by 1-2 GiB): after
    map_large_host_allocations, the same 600 MiB of 2 MiB tensors as above leave the resident set when freed, with no
    release, although a freed 4 MiB block tried to raise glibc's threshold first."""
    before, freed = run("""
        import torch
        from verl.workers.memory import resident_bytes
        from verl.workers.process_memory import map_large_host_allocations
        resident_gib = lambda: resident_bytes() / (1 << 30)
        assert map_large_host_allocations()
        x = torch.ones(1 << 20)
        del x
        base = resident_gib()
        blocks = [torch.ones(1 << 19) for _ in range(300)]
        keep = torch.ones(1 << 19)
        del blocks
        print(base, resident_gib())
    """)
    assert freed - before < 0.1, (before, freed)


def test_a_threshold_the_user_set_is_kept(monkeypatch):
    """Guards against overriding the user's own glibc setting (returns before calling mallopt: safe in-process)."""
    from verl.workers.process_memory import map_large_host_allocations
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert map_large_host_allocations() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert map_large_host_allocations() is False
