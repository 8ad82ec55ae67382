"""The retrieval service keeps off devices it was not given (issue 56): a BM25 service never imports JAX, every
part's device is named in the start line and ``/health``, and a GPU asked for where none can be used is refused.

Real services on loopback (``ServerProcess``) over the small test corpus; JAX is replaced by a tripwire package on
the service's PYTHONPATH that records who imported it, so the test needs no JAX (nor a GPU) to see an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from retrieval_server.launcher import ServerProcess
from tests.retrieval_servers import SERVER_ARGS

pytestmark = pytest.mark.slow  # starts services: not in `make test-fast`

ROOT = Path(__file__).resolve().parents[2]
# A stand-in `jax` package: importing it (or jax.lax) appends the importing stack to $JAX_TRIPWIRE_LOG, then fails
# as an absent JAX does, so bm25s goes on as it would without JAX.
TRIPWIRE = '''
import os
import traceback

with open(os.environ["JAX_TRIPWIRE_LOG"], "a") as log:
    log.write("jax imported by:\\n" + "".join(traceback.format_stack()) + "\\n")
raise ImportError("tripwire jax: records who imports it")
'''
NO_PART = {"encoder": None, "reranker": None}


@pytest.fixture
def tripwire_env(tmp_path) -> tuple[dict[str, str], Path]:
    """(an environment whose PYTHONPATH puts the tripwire ``jax`` first, the file it writes to when imported)."""
    (tmp_path / "tripwire" / "jax").mkdir(parents=True)
    (tmp_path / "tripwire" / "jax" / "__init__.py").write_text(TRIPWIRE)
    log = tmp_path / "jax_imports.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "tripwire"), str(ROOT)]),
           "JAX_TRIPWIRE_LOG": str(log)}
    return env, log


def test_a_bm25_service_never_imports_jax(corpus_path, tmp_path, tripwire_env):
    """Guards against the BM25 service taking a GPU it was not given: bm25s imports ``jax.lax`` when JAX is installed
    and runs a top-k with it, and JAX then preallocates 75 % of the first GPU (105 GiB of an H200 in issue 56). Building
    a BM25 index, serving it and answering /retrieve must never import JAX; /health and the start line name the CPU
    as the index's device."""
    env, log = tripwire_env
    index = tmp_path / "index_bm25"
    subprocess.run([sys.executable, "-m", "retrieval_server.build_index", "--corpus", str(corpus_path), "--out",
                    str(index), "--retriever", "bm25"], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    with ServerProcess(index, corpus_path, SERVER_ARGS, cwd=ROOT, env=env) as server:
        health = server.wait_ready()
        answer = httpx.post(server.url + "/retrieve", json={"queries": ["glass blowers of Kelbrook", "ferry songs"],
                                                            "topk": 3}, timeout=60)
        log_text = server.log_text()
    assert answer.status_code == 200 and [len(hits) for hits in answer.json()["result"]] == [3, 3]
    assert not log.exists(), log.read_text()[-3000:]
    assert health["devices"] == {"index": {"device": "cpu", "how": "bm25s", "device_memory_gib": 0.0}, **NO_PART}
    assert "(index on cpu (bm25s); no encoder; no reranker)" in log_text  # the start line, before loading
    assert "index ready: index on cpu (bm25s); no encoder; no reranker" in log_text


def test_a_dense_service_stays_on_the_cpu_unless_asked(flat_index, corpus_path, tmp_path):
    """Guards against a dense service putting its encoder (sentence-transformers picks CUDA when it sees one) or its
    FAISS index on a GPU nobody asked for: by default /health names the CPU for both, and the service says so. And
    against it importing bm25s (with numba and SciPy, a third of a dense start's CPU): a tripwire ``bm25s`` first on
    its path fails any import of it, and the service starts."""
    (tmp_path / "tripwire" / "bm25s").mkdir(parents=True)
    (tmp_path / "tripwire" / "bm25s" / "__init__.py").write_text('raise ImportError("tripwire bm25s")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "tripwire"), str(ROOT)])}
    with ServerProcess(flat_index, corpus_path, SERVER_ARGS, cwd=ROOT, env=env) as server:
        health = server.wait_ready()
        log_text = server.log_text()
    assert health["devices"] == {"index": {"device": "cpu", "how": "faiss", "device_memory_gib": 0.0},
                                 "encoder": {"device": "cpu", "how": None, "device_memory_gib": 0.0},
                                 "reranker": None}
    assert "index ready: index on cpu (faiss); encoder on cpu; no reranker" in log_text


def _serve(index: Path, corpus: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrieval_server.serve", "--index", str(index), "--corpus",
                           str(corpus), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_gpu_that_cannot_be_used_is_refused_before_loading(flat_index, corpus_path):
    """Guards against a GPU asked for where none can be used being ignored (the service quietly on the CPU) or failing
    later in the background load: ``--encoder-device cuda`` with ``CUDA_VISIBLE_DEVICES=''`` and ``--faiss-gpu shard``
    where FAISS sees no GPU exit 2 before the port is bound, naming the flag and the variable."""
    hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = _serve(flat_index, corpus_path, "--encoder-device", "cuda", env=hidden)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--encoder-device cuda:0: no GPU can be used here" in done.stderr
    assert "CUDA_VISIBLE_DEVICES=''" in done.stderr and "serving" not in done.stderr
    done = _serve(flat_index, corpus_path, "--faiss-gpu", "shard", env=hidden)
    assert done.returncode == 2 and "--faiss-gpu shard: FAISS sees no GPU" in done.stderr, done.stderr[-2000:]
    done = _serve(flat_index, corpus_path, "--encoder-device", "gpu0")
    assert done.returncode == 2 and "--encoder-device must be cpu, cuda or cuda:N" in done.stderr, done.stderr[-2000:]


def test_jax_env_is_set_for_the_service_and_its_children():
    """Guards against a library of the service starting JAX on a GPU after all: the service's ``main`` sets
    JAX_PLATFORMS=cpu and XLA_PYTHON_CLIENT_PREALLOCATE=false first (kept where the user set them)."""
    code = ("import json, os, sys; from retrieval_server.serve import cli as serve; sys.argv = ['serve', '--help']\n"
            "try:\n    serve.main()\nexcept SystemExit:\n    pass\n"
            "print(json.dumps({k: os.environ.get(k) for k in ('JAX_PLATFORMS', 'XLA_PYTHON_CLIENT_PREALLOCATE')}))")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    expected = {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert json.loads(done.stdout.splitlines()[-1]) == expected
