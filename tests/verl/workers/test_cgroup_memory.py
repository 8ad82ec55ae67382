"""The host's memory as a run can have it: a memory cgroup's limit (a container's) when it is below the host's RAM,
read from cgroup v2's or v1's files (``process_memory.host_total_bytes`` / ``host_available_bytes``), and the
start-up estimate's "may not fit" check measured against it (``memory.device_memory``). Each test lays out the
cgroup's files as the kernel writes them, in a folder of its own."""

from __future__ import annotations

import os

import pytest
import torch

from verl.workers import process_memory
from verl.workers.memory import device_memory

GIB = 1 << 30
HOST = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.fixture
def cgroup(tmp_path, monkeypatch):
    """A cgroup folder read in place of /sys/fs/cgroup (the files' reading is cached per process: cleared around)."""
    monkeypatch.setattr(process_memory, "CGROUP_ROOT", str(tmp_path))
    process_memory._cgroup_files.cache_clear()
    yield tmp_path
    process_memory._cgroup_files.cache_clear()


def write(folder, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_v2_limit_is_the_hosts_memory(cgroup):
    write(cgroup, {"memory.max": f"{GIB}\n", "memory.current": f"{GIB // 4}\n",
                   "memory.stat": f"anon {GIB // 8}\nfile {GIB // 8}\ninactive_file {GIB // 16}\nactive_file 0\n"})
    assert process_memory.host_total_bytes() == GIB
    # the limit less what the cgroup holds, its inactive file pages counted as free (the kernel reclaims them first)
    expected = GIB - GIB // 4 + GIB // 16
    assert process_memory.host_available_bytes() == min(expected, process_memory._meminfo("MemAvailable"))
    if not torch.cuda.is_available():
        assert device_memory() == GIB  # the start-up "may not fit" check compares against the container's limit


def test_cgroup_v1_limit_is_read_too(cgroup):
    write(cgroup, {"memory/memory.limit_in_bytes": f"{2 * GIB}\n", "memory/memory.usage_in_bytes": f"{GIB}\n",
                   "memory/memory.stat": f"cache {GIB // 2}\ntotal_inactive_file {GIB // 2}\n"})
    assert process_memory.host_total_bytes() == 2 * GIB
    assert process_memory.host_available_bytes() == min(2 * GIB - GIB + GIB // 2,
                                                        process_memory._meminfo("MemAvailable"))


@pytest.mark.parametrize("files", [
    {"memory.max": "max\n", "memory.current": f"{GIB}\n"},  # v2 without a limit
    {"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": f"{GIB}\n"},  # v1's
    {},  # no memory controller mounted
], ids=["v2-max", "v1-unlimited", "none"])
def test_no_limit_below_the_host_means_the_hosts_ram(cgroup, files):
    write(cgroup, files)
    assert process_memory.host_total_bytes() == process_memory._meminfo("MemTotal")
    # MemAvailable itself (read twice, a moment apart, while other processes run)
    assert abs(process_memory.host_available_bytes() - process_memory._meminfo("MemAvailable")) < GIB // 2
    if not torch.cuda.is_available():
        # MemTotal and sysconf's pages agree to within the kernel's own reservations
        assert abs(device_memory() - HOST) < 0.05 * HOST
