"""retrieval_launch.sh: builds a missing index only when asked (BUILD=1) or for the demo, then execs the server
with the extra arguments; a missing corpus or index is refused with status 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from retrieval_server.launcher import free_port

pytestmark = pytest.mark.slow  # runs retrieval_launch.sh (index builds, servers): not in `make test-fast`

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "retrieval_launch.sh"
NAMES = ("BUILD", "CORPUS", "INDEX_DIR", "RETRIEVER")  # the launcher's variables that choose what is served or built


def _env(**names: str) -> dict[str, str]:
    """This process's environment without the launcher's choices of a caller, plus ``names`` and PYTHON."""
    return {**{k: v for k, v in os.environ.items() if k not in NAMES}, "PYTHON": sys.executable, **names}


@contextmanager
def _launched(script: Path, env: dict[str, str], args: list[str], log: Path) -> Iterator[dict]:
    """Run ``script`` with ``env``; yields its server's first 200 /health answer, stops the server on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", str(script), *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(2400):  # the process is checked every 0.1 s; a failed launch ends the loop at once
            assert proc.poll() is None, log.read_text()
            try:
                response = httpx.get(f"http://127.0.0.1:{env['PORT']}/health", timeout=2)
                if response.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError(f"no healthy server after 240 s:\n{log.read_text()}")
        yield response.json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_build_1_builds_the_missing_index_and_serves_it(corpus_path, tmp_path):
    """Guards against BUILD=1 not building, the launcher serving without an index, ignoring its env vars, or
    dropping extra args."""
    index_dir, port = tmp_path / "index", free_port()
    env = _env(BUILD="1", CORPUS=str(corpus_path), INDEX_DIR=str(index_dir), PORT=str(port), TOPK="2")
    with _launched(SCRIPT, env, ["--threads", "1", "--max-topk", "7"], tmp_path / "launch.log") as health:
        assert health["retriever"] == "bm25" and health["default_topk"] == 2 and health["max_topk"] == 7
        assert json.loads((index_dir / "manifest.json").read_text())["retriever"] == "bm25"
        result = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["Varnel River"]}).json()
        assert len(result["result"][0]) == 2


def test_mistyped_index_dir_is_refused_not_built(corpus_path, tmp_path):
    """Guards against a mistyped INDEX_DIR silently starting a new index build (hours on wiki-18): without BUILD=1
    a named index that does not exist is an error naming the directory and the two ways out."""
    index_dir = tmp_path / "indexes" / "e5_flta"
    for named in ({"CORPUS": str(corpus_path), "INDEX_DIR": str(index_dir)}, {"INDEX_DIR": str(index_dir)}):
        env = _env(**named, PORT=str(free_port()))
        done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert f"{index_dir} has no manifest.json" in done.stderr
        assert all(way in done.stderr for way in ("set INDEX_DIR", "BUILD=1", "-m retrieval_server.build_index"))
        assert not (tmp_path / "indexes").exists()


def test_demo_is_built_when_nothing_is_named(corpus_path, tmp_path):
    """Guards against the BUILD rule breaking the demo: a bare `bash retrieval_launch.sh` (CORPUS and INDEX_DIR
    unset) still builds the default index. (A copy of the script in a scratch root, with a small corpus in place
    of the generated demo knowledge base, so the test neither writes into the repository nor runs demo_kb.)"""
    shutil.copy(SCRIPT, tmp_path / "retrieval_launch.sh")
    (tmp_path / "data" / "demo").mkdir(parents=True)
    shutil.copy(corpus_path, tmp_path / "data" / "demo" / "corpus.jsonl")
    env = _env(PORT=str(free_port()), PYTHONPATH=str(ROOT))
    with _launched(tmp_path / "retrieval_launch.sh", env, ["--threads", "1"], tmp_path / "launch.log") as health:
        assert health["retriever"] == "bm25"
        assert (tmp_path / "data" / "demo" / "index_bm25" / "manifest.json").is_file()


def test_launch_refuses_a_missing_custom_corpus(tmp_path):
    """Guards against the launcher generating the demo corpus when the user named another one."""
    env = _env(CORPUS=str(tmp_path / "nope.jsonl"))
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nope.jsonl not found" in done.stderr


def test_an_index_named_without_corpus_serves_its_own_corpus_and_prepares_no_demo(corpus_path, tmp_path):
    """Guards against issue 37: INDEX_DIR without CORPUS generated the demo knowledge base into data/demo, then the
    service refused with a corpus mismatch and suggested rebuilding the user's index over the demo corpus. (A copy
    of the script in a scratch root, so data/demo is the scratch root's.)"""
    shutil.copy(SCRIPT, tmp_path / "retrieval_launch.sh")
    index_dir = tmp_path / "mine" / "dense_or_bm25"
    subprocess.run([sys.executable, "-m", "retrieval_server.build_index", "--corpus", str(corpus_path), "--out",
                    str(index_dir), "--retriever", "bm25"], cwd=ROOT, check=True, capture_output=True, timeout=300)
    env = _env(INDEX_DIR=str(index_dir), PORT=str(free_port()), PYTHONPATH=str(ROOT))
    with _launched(tmp_path / "retrieval_launch.sh", env, ["--threads", "1"], tmp_path / "launch.log") as health:
        manifest = json.loads((index_dir / "manifest.json").read_text())
        assert health["corpus_sha256"] == manifest["corpus_sha256"]
    assert not (tmp_path / "data").exists(), "nothing of the demo is prepared for a user's index"
    moved = tmp_path / "moved"
    index_dir.rename(moved)  # its manifest names a corpus path; make that path missing instead
    (moved / "manifest.json").write_text(json.dumps({**manifest, "corpus_path": str(tmp_path / "gone.jsonl")}))
    done = subprocess.run(["bash", str(tmp_path / "retrieval_launch.sh")], env={**env, "INDEX_DIR": str(moved)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "set CORPUS to that JSONL file" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()


def test_hints_name_the_users_retriever_kind(tmp_path):
    """Guards against the rebuild hint for a mistyped dense index saying --retriever bm25 (the demo's kind)."""
    for name, kind in (("e5_flta", "dense"), ("wiki_bm25x", "bm25")):
        env = _env(INDEX_DIR=str(tmp_path / name), PORT=str(free_port()))
        done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and f"--retriever {kind}" in done.stderr and f"RETRIEVER={kind}" in done.stderr
    done = subprocess.run(["bash", str(SCRIPT)], env=_env(CORPUS=str(tmp_path / "c.jsonl")), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
