"""vLLM-CPU tensor-parallel shared-memory leftovers are removed before an engine starts, live ones are kept.

Guards against the second CPU tensor-parallel run on a machine failing with "create shm in SHMManager failed.
errno: 17": vLLM names the files the same for every run under external_launcher and never unlinks them.
"""

from __future__ import annotations

import mmap

import pytest

pytest.importorskip("vllm")
from verl.workers.rollout.vllm_rollout import remove_stale_cpu_shm  # noqa: E402


def test_only_unmapped_cpushm_files_are_removed(tmp_path):
    stale, live, other = tmp_path / "-tp:0-[0-1]-cpushm_0", tmp_path / "-tp:0-[0-1]-cpushm_1", tmp_path / "psm_1"
    for path in (stale, live, other):
        path.write_bytes(b"\0" * 4096)
    with open(live, "r+b") as f, mmap.mmap(f.fileno(), 4096):  # mapped by this live process
        removed = remove_stale_cpu_shm(str(tmp_path))
        assert removed == [str(stale)]
        assert not stale.exists() and live.exists() and other.exists()
    assert remove_stale_cpu_shm(str(tmp_path)) == [str(live)]  # unmapped now
