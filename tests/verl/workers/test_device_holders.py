"""The trainer's start-up check of other processes on its GPUs (``verl.workers.device_holders``), on recorded
``nvidia-smi --query-compute-apps`` output: no GPU or driver is needed (the check on a real GPU is in tests/gpu)."""

from __future__ import annotations

import os
import stat

import pytest

from verl.workers.device_holders import (
    GIB,
    QUERY,
    DeviceHolder,
    others_message,
    parse_compute_apps,
    query_compute_apps,
    report_other_holders,
)

H200 = "GPU-5c9d8e0f-3a1b-4c2d-9e8f-0a1b2c3d4e5f"
OTHER_GPU = "GPU-77aa01bc-0d4e-4f5a-8b6c-1d2e3f405162"
# What `nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits` prints (MiB): issue
# 56's retrieval service (its JAX took 105 GiB of the H200), a small process on the same GPU, one on another GPU
# and one whose memory the driver does not report (a process of another container).
RECORDED = (f"{H200}, 4242, 107520\n"
            f"{H200}, 5151, 512\n"
            f"{OTHER_GPU}, 6060, 20480\n"
            f"{H200}, 7070, [N/A]\n")
H200_TOTAL = 143771 * (1 << 20)
DEVICES = {H200[4:].lower(): ("cuda:0", H200_TOTAL)}
COMMANDS = {4242: "python -m retrieval_server.serve --index data/demo/index_bm25", 5151: "", 7070: ""}


def test_recorded_rows_are_parsed():
    """Guards the parser of the driver's per-process accounting: UUIDs compared without nvidia-smi's GPU- prefix
    (torch prints them without), MiB to bytes, [N/A] as unknown, the no-process line as no rows, a malformed row
    named."""
    holders = parse_compute_apps(RECORDED)
    assert holders[0] == DeviceHolder("5c9d8e0f-3a1b-4c2d-9e8f-0a1b2c3d4e5f", 4242, 107520 << 20)
    assert [(h.pid, h.used_bytes) for h in holders[1:]] == [(5151, 512 << 20), (6060, 20480 << 20), (7070, None)]
    assert parse_compute_apps("") == [] and parse_compute_apps("No running processes found\n") == []
    with pytest.raises(ValueError, match="not gpu_uuid, pid, used_memory: 'GPU-x,12'"):
        parse_compute_apps("GPU-x, 12\n")


def test_a_process_holding_the_gpu_is_named_and_the_run_warned():
    """Guards against issue 56's failure mode: another process holding most of the GPU must be named at start-up
    ("process PID holds X GiB of cuda:0") with what is left, and the run warned that it will not fit, instead of a
    CUDA out-of-memory traceback at its first optimizer step. This process and GPUs the run does not use are not
    counted; a run that fits in what is left is told who is there without the warning."""
    holders = parse_compute_apps(RECORDED)
    message, short = others_message(holders, DEVICES, 37.0 * GIB, own_pids={5151}, commands=COMMANDS)
    assert short
    assert ("process 4242 (python -m retrieval_server.serve --index data/demo/index_bm25) holds 105.0 GiB of cuda:0"
            in message)
    assert "process 7070 holds an amount the driver does not report of cuda:0" in message
    assert "5151" not in message and "6060" not in message
    assert "cuda:0: 35.4 of 140.4 GiB left for this run, which expects about 37.0 GiB per device" in message
    assert "will likely stop with CUDA out of memory" in message
    message, short = others_message(holders, DEVICES, 20.0 * GIB, own_pids={5151}, commands=COMMANDS)
    assert not short and "holds 105.0 GiB of cuda:0" in message and "out of memory" not in message
    assert others_message(holders, {OTHER_GPU[4:].lower(): ("cuda:0", H200_TOTAL)}, GIB, {6060}, COMMANDS) is None


def _fake_nvidia_smi(directory, output: str, status: int = 0) -> None:
    """An ``nvidia-smi`` on PATH that prints ``output`` for exactly ``QUERY``'s arguments (else fails)."""
    script = directory / "nvidia-smi"
    expected = " ".join(QUERY[1:])
    script.write_text(f'#!/bin/sh\n[ "$*" = "{expected}" ] || {{ echo "unexpected arguments: $*" >&2; exit 9; }}\n'
                      f"cat <<'EOT'\n{output}EOT\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_the_driver_is_asked_with_the_query_and_absent_drivers_are_skipped(tmp_path, monkeypatch):
    """Guards the query's command line (the columns the parser reads, in MiB without units) and the skip where no
    NVIDIA driver exists: no nvidia-smi on PATH, or one that fails (no device), is no check at all, not an error."""
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert query_compute_apps() is None
    assert report_other_holders(37.0 * GIB, "local") is None  # skipped before any CUDA call
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path), os.defpath]))  # the fake first, then sh and cat
    _fake_nvidia_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9)
    assert query_compute_apps() is None
    _fake_nvidia_smi(tmp_path, RECORDED)
    assert [h.pid for h in query_compute_apps()] == [4242, 5151, 6060, 7070]
