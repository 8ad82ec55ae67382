"""The host-side memory helpers: the per-step peak (``peak_memory_metrics``), handing freed pages back
(``release_host_memory``) and keeping them for reuse (``keep_freed_host_memory``, ``trainer.host_memory``). Each runs
in a fresh process, so the allocator's state is this test's own."""

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
    from verl.workers.process_memory import apply_host_memory, keep_freed_host_memory, map_large_host_allocations
    for name, value in (("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536"), ("MALLOC_MMAP_THRESHOLD_", "65536"),
                        ("MALLOC_TRIM_THRESHOLD_", "0"), ("MALLOC_MMAP_MAX_", "65536")):
        monkeypatch.setenv(name, value)
        assert map_large_host_allocations() is False, name
        assert keep_freed_host_memory() is False, name
        assert apply_host_memory("reuse") is False and apply_host_memory("release") is False, name
        monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="trainer.host_memory='keep': expected one of reuse, release"):
        apply_host_memory("keep")


# The same allocations three times, large (256 MiB, what a chunk of a 49k-vocabulary head takes) and small (2 MiB):
# the page faults of the first round and of the third.
REFAULTS = """
    import resource, torch
    from verl.workers.process_memory import {setting}
    assert {setting}()
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    def round_():
        start = faults()
        big = torch.ones(1 << 26)
        blocks = [torch.ones(1 << 19) for _ in range(100)]
        del big, blocks
        return faults() - start
    first = round_()
    round_()
    print(first, round_())
"""


def test_freed_host_memory_is_reused_without_faulting_pages_in_again():
    """Guards against every micro-batch faulting in (and the kernel zeroing) fresh pages for tensors the previous one
    just freed (40 % of the real model's update on 2 cores): with keep_freed_host_memory the third round of the same
    tensors faults almost no page in; with the pages handed back (map_large_host_allocations), it faults them all."""
    first, third = run(REFAULTS.format(setting="keep_freed_host_memory"))
    assert first > 60_000 and third < 0.05 * first, (first, third)  # 456 MiB of 4 KiB pages: 117k (fewer if huge)
    first, third = run(REFAULTS.format(setting="map_large_host_allocations"))
    assert third > 0.5 * first, (first, third)


def test_train_state_keeps_or_releases_host_memory_as_configured():
    """Guards against trainer.host_memory not reaching the update, and against reuse letting the resident set creep:
    the same two updates of 8 micro-batches that allocate about 100 MiB each. Under release (pages handed back after
    each micro-batch) the second update faults its pages in 8 times; under reuse once, and the free pages still leave
    the resident set when the optimiser step is done."""
    code = """
        import resource, sys, torch
        from torch import nn
        from verl.protocol import Batch
        from verl.workers.memory import resident_bytes
        from verl.workers.train_utils import TrainState
        faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.manual_seed(0)
        model = nn.Linear(1024, 8192)
        state = TrainState(model, 1e-3, 0.0, 0.0, 4, None, host_memory=sys.argv[1])
        batch = Batch({"x": torch.randn(8192, 1024), "loss_mask": torch.ones(8192, 1)})
        loss_fn = lambda micro, counts: ((model(micro["x"]) ** 2).mean(), {})
        resident = resident_bytes()
        for _ in range(2):
            start = faults()
            state.update(batch, 8192, 1, lambda mini: mini.split(1024), loss_fn)
        print(faults() - start, (resident_bytes() - resident) / (1 << 30))
    """
    runs = {}
    for mode in ("release", "reuse"):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), mode], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[mode] = [float(x) for x in done.stdout.split()]
    (release_faults, _), (reuse_faults, reuse_grown) = runs["release"], runs["reuse"]
    assert reuse_faults < 0.4 * release_faults, runs
    # GiB more resident after two updates than before them: AdamW's two moments and the gradients (0.09 GiB), not
    # the ~0.4 GiB of freed activations a heap never trimmed keeps
    assert reuse_grown < 0.2, runs


def test_kept_memory_goes_back_when_the_host_runs_short():
    """Guards against reuse holding freed memory the host needs (a step's peak grew to 1.8x its estimate on the
    paper table's settings): 600 MiB of freed tensors stay resident under reuse while the host has room (a guard
    whose reserve is 0), and leave within a second once the host is short (a guard whose reserve is more than the
    host's memory). ``apply_host_memory("reuse")`` starts the process's guard, with a quarter of the host kept free."""
    kept, short, reserve = run("""
        import time, torch
        from verl.workers.memory import resident_bytes
        from verl.workers.process_memory import FreedMemoryGuard, apply_host_memory, host_total_bytes
        assert apply_host_memory("reuse")
        started = FreedMemoryGuard._started
        assert started is not None and started.is_alive() and FreedMemoryGuard.start_once() is started
        default_reserve, started.reserve = started.reserve, 0  # the process's own guard: never short from here on
        resident_gib = lambda: resident_bytes() / (1 << 30)
        base = resident_gib()
        blocks = [torch.ones(1 << 19) for _ in range(300)]  # 2 MiB each, from the heap under reuse
        keep = torch.ones(1 << 19)  # alive above them: the heap's top cannot shrink by itself
        del blocks
        time.sleep(0.5)
        kept = resident_gib() - base
        guard = FreedMemoryGuard(reserve=2 * host_total_bytes(), interval=0.05)
        guard.start()
        deadline = time.monotonic() + 5
        while guard.trims == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        print(kept, resident_gib() - base, default_reserve / host_total_bytes())
    """)
    assert kept > 0.4, kept  # reuse keeps what was freed while the host has room
    assert short < 0.2, (kept, short)  # and hands it back when the host is short
    assert reserve == pytest.approx(0.25), reserve
