"""FAISS is optional (setup.py's ``cpu`` / ``gpu`` extras): a BM25 index is built, served and launched as the demo
without it, and a dense build or service without it stops with exit status 2 naming the package to install.

Every process here runs with a ``sitecustomize`` on its PYTHONPATH that sets ``sys.modules["faiss"] = None``, so
``import faiss`` fails in it as on a machine where faiss is not installed (checked by ``no_faiss_env``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from retrieval_server.launcher import ServerProcess, free_port
from tests.retrieval_servers import SERVER_ARGS

pytestmark = pytest.mark.slow  # builds indexes and starts servers: not in `make test-fast`

ROOT = Path(__file__).resolve().parents[2]
PASSAGES = [("harbor", "Quillon is a harbor town where ferries leave for the outer islands."),
            ("glass", "The glassblowers of Tessmoor shape lanterns from river sand."),
            ("clock", "A zephyrine clock chimes thirteen times in the tower of Ardley."),
            ("orchard", "Pear orchards line the valley road south of Morrow.")]


@pytest.fixture()
def no_faiss_env(tmp_path) -> dict[str, str]:
    """This process's environment, with ``import faiss`` failing in the processes started with it."""
    blocker = tmp_path / "no_faiss"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\n\nsys.modules['faiss'] = None  # as if not installed\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", "import faiss"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, "faiss is not blocked"
    return env


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": pid, "contents": text}) + "\n" for pid, text in PASSAGES))
    return path


def _build(corpus: Path, out: Path, retriever: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrieval_server.build_index", "--corpus", str(corpus), "--out",
                           str(out), "--retriever", retriever], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def _assert_names_faiss(log: str) -> None:
    assert "needs FAISS" in log and "pip install faiss-cpu" in log and ".[cpu]" in log, log
    assert "Traceback" not in log, log


def test_bm25_index_is_built_and_served_without_faiss(no_faiss_env, tmp_path):
    """Guards against build_index (or the service) importing FAISS for a BM25 index: with faiss absent the build
    failed with ModuleNotFoundError, though faiss is only in setup.py's extras."""
    corpus, index_dir = _corpus(tmp_path), tmp_path / "index_bm25"
    done = _build(corpus, index_dir, "bm25", no_faiss_env)
    assert done.returncode == 0, done.stderr
    assert json.loads((index_dir / "manifest.json").read_text())["retriever"] == "bm25"
    with ServerProcess(index_dir, corpus, SERVER_ARGS, env=no_faiss_env, cwd=ROOT) as server:
        health = server.wait_ready()
        assert health["retriever"] == "bm25" and health["passages"] == len(PASSAGES)
        result = httpx.post(server.url + "/retrieve", json={"queries": ["zephyrine clock", "glassblowers lanterns"],
                                                           "topk": 2}, timeout=30).json()["result"]
        assert [hits[0]["id"] for hits in result] == ["clock", "glass"]
        assert result[0][0]["contents"] == PASSAGES[2][1]


def test_demo_launch_builds_and_serves_bm25_without_faiss(no_faiss_env, tmp_path):
    """Guards against `bash retrieval_launch.sh` (the demo: builds data/demo/index_bm25 when missing, then serves
    it) needing FAISS. (A copy of the script in a scratch root with a small corpus in place of the generated demo
    knowledge base, as in test_launch_script.py.)"""
    shutil.copy(ROOT / "retrieval_launch.sh", tmp_path / "retrieval_launch.sh")
    (tmp_path / "data" / "demo").mkdir(parents=True)
    shutil.copy(_corpus(tmp_path), tmp_path / "data" / "demo" / "corpus.jsonl")
    port = free_port()
    env = {**{k: v for k, v in no_faiss_env.items() if k not in ("BUILD", "CORPUS", "INDEX_DIR", "RETRIEVER")},
           "PYTHON": sys.executable, "PORT": str(port)}
    with ServerProcess(port=port, command=["bash", str(tmp_path / "retrieval_launch.sh"), "--threads", "1"],
                       cwd=tmp_path, env=env) as server:
        assert server.wait_ready(timeout=240)["retriever"] == "bm25"
        assert (tmp_path / "data" / "demo" / "index_bm25" / "manifest.json").is_file()
        result = httpx.post(server.url + "/retrieve", json={"queries": ["pear orchards"]}, timeout=30).json()
        assert result["result"][0][0]["id"] == "orchard"


def test_dense_build_without_faiss_exits_2_naming_it(no_faiss_env, tmp_path):
    """Guards against a dense build without FAISS ending in a traceback (or after scanning the corpus and creating
    --out): it is an input error, exit status 2, saying what to install."""
    out = tmp_path / "index_dense"
    done = _build(_corpus(tmp_path), out, "dense", no_faiss_env)
    assert done.returncode == 2, done.stderr
    _assert_names_faiss(done.stderr)
    assert not out.exists()


def test_dense_service_without_faiss_exits_2_naming_it(no_faiss_env, flat_index, corpus_path):
    """Guards against serving a dense index without FAISS failing in the server's background load (exit 1, a
    traceback): it is refused before the server starts, exit status 2, saying what to install."""
    with ServerProcess(flat_index, corpus_path, SERVER_ARGS, env=no_faiss_env, cwd=ROOT) as server:
        assert server.wait_exit(timeout=120) == 2, server.log_text()
        _assert_names_faiss(server.log_text())
