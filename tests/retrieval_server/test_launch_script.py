"""retrieval_launch.sh: builds the index when missing, then execs the server with the extra arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from retrieval_server.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_launch_builds_the_missing_index_and_serves_it(corpus_path, tmp_path):
    """Guards against the launcher serving without an index, ignoring its env vars, or dropping extra args."""
    index_dir, port, log = tmp_path / "index", free_port(), tmp_path / "launch.log"
    env = {**os.environ, "CORPUS": str(corpus_path), "INDEX_DIR": str(index_dir), "PORT": str(port),
           "TOPK": "2", "PYTHON": sys.executable}
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", str(ROOT / "retrieval_launch.sh"), "--threads", "1", "--max-topk", "7"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        health = None
        for _ in range(2400):  # the process is checked every 0.1 s; a failed launch ends the loop at once
            assert proc.poll() is None, log.read_text()
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                if response.status_code == 200:
                    health = response.json()
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert health is not None, log.read_text()
        assert health["retriever"] == "bm25" and health["default_topk"] == 2 and health["max_topk"] == 7
        assert json.loads((index_dir / "manifest.json").read_text())["retriever"] == "bm25"
        result = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["Varnel River"]}).json()
        assert len(result["result"][0]) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_launch_refuses_a_missing_custom_corpus(tmp_path):
    """Guards against the launcher generating the demo corpus when the user named another one."""
    env = {**os.environ, "CORPUS": str(tmp_path / "nope.jsonl"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "retrieval_launch.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "nope.jsonl not found" in done.stderr
