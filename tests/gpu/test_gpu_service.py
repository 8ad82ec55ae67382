"""The retrieval service and the trainer's start-up check on a machine with a GPU (issue 56): a BM25 service holds
none of the GPU (there, JAX is installed: bm25s used to import it, and JAX took 75 % of the GPU), a re-ranker asked
onto the GPU says what it took, and a process holding the GPU is named by the trainer's check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess
from tests.gpu.gpu_helpers import DEVICE, cuda_only, driver_held_bytes
from tests.retrieval_server.test_rerank import _tiny_cross_encoder
from tests.retrieval_servers import SERVER_ARGS
from verl.workers.device_holders import GIB, report_other_holders

pytestmark = pytest.mark.gpu

# A process that takes 1 GiB of cuda:0 and holds it until its stdin closes.
HOLDER = ("import sys, torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda:0'); torch.cuda.synchronize(); "
          "print('holding', flush=True); sys.stdin.read()")


@pytest.fixture(scope="module")
def bm25_index(corpus_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu_bm25")
    build_index(corpus_path, out, retriever="bm25", progress=False)
    return out


def _retrieve(server: ServerProcess) -> list[list[dict]]:
    answer = httpx.post(server.url + "/retrieve", json={"queries": ["glass blowers of Kelbrook"], "topk": 3},
                        timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


@cuda_only
def test_a_bm25_service_holds_none_of_the_gpu(bm25_index, corpus_path):
    """Guards against issue 56's 105 GiB: a BM25 service, started with nothing set by hand on a machine where JAX is
    installed, builds, loads and answers without the driver accounting any GPU memory to it."""
    with ServerProcess(bm25_index, corpus_path, SERVER_ARGS) as server:
        health = server.wait_ready()
        assert len(_retrieve(server)[0]) == 3
        held = driver_held_bytes(server.proc.pid)
    assert health["devices"]["index"]["device"] == "cpu" and held == 0, f"{held / GIB:.2f} GiB held"


def test_a_reranker_asked_onto_the_device_says_what_it_took(bm25_index, corpus_path, tmp_path):
    """Guards ``--encoder-device``: the re-ranker runs where asked, /health names that device and the memory it took
    there (on a GPU: more than nothing, under 1 GiB for a tiny cross-encoder, as the driver also counts it), and
    the BM25 index stays on the CPU."""
    _tiny_cross_encoder(tmp_path / "cross_encoder", num_labels=1)
    args = [*SERVER_ARGS, "--reranker", str(tmp_path / "cross_encoder"), "--encoder-device", DEVICE]
    with ServerProcess(bm25_index, corpus_path, args) as server:
        health = server.wait_ready()
        assert len(_retrieve(server)[0]) == 3
        held = driver_held_bytes(server.proc.pid) if DEVICE == "cuda" else 0
    devices = health["devices"]
    assert devices["index"]["device"] == "cpu" and devices["encoder"] is None
    assert devices["reranker"]["device"] == ("cuda:0" if DEVICE == "cuda" else "cpu")
    if DEVICE == "cuda":
        assert 0 < devices["reranker"]["device_memory_gib"] < 1 and 0 < held < GIB, (devices, held)


@cuda_only
def test_a_process_holding_the_gpu_is_named_at_start_up():
    """Guards the trainer's start-up check on a real driver (its parser is tested on recorded output in
    tests/verl/workers/test_device_holders.py): a process holding 1 GiB of cuda:0 is named with its memory, matched
    to this process's cuda:0 by UUID, and a run that needs the whole device is warned."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        total = torch.cuda.get_device_properties(0).total_memory
        message = report_other_holders(float(total), "local")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert message is not None and f"process {holder.pid} " in message, message
    line = next(line for line in message.splitlines() if line.startswith(f"process {holder.pid} "))
    held = float(line.split(" holds ")[1].split(" GiB")[0])
    assert line.endswith("GiB of cuda:0") and 1.0 <= held < 2.0, line
    assert "will likely stop with CUDA out of memory" in message
