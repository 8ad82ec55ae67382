"""retrieval_server.serve accepts Search-R1's retrieval_server.py flags (issue 37: they were an argparse error with no
hint), with their meaning, and a notice where ours differ."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from retrieval_server.launcher import free_port
from retrieval_server.serve.cli import translate_search_r1_flags

ROOT = Path(__file__).resolve().parents[2]


def test_flags_translate_to_ours(tmp_path):
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / "manifest.json").write_text("{}")
    (tmp_path / "idx" / "e5_Flat.index").write_bytes(b"x")
    argv, notices = translate_search_r1_flags(
        ["--index_path", str(tmp_path / "idx" / "e5_Flat.index"), "--corpus_path=c.jsonl", "--topk", "3",
         "--retriever_name", "e5", "--retriever_model", "intfloat/e5-base-v2", "--faiss_gpu", "--port", "1"])
    assert argv == ["--index", str(tmp_path / "idx"), "--corpus", "c.jsonl", "--topk", "3", "--model",
                    "intfloat/e5-base-v2", "--faiss-gpu", "shard", "--port", "1"]
    assert len(notices) == 3 and any("manifest.json" in n for n in notices)


@pytest.mark.slow  # starts a server
def test_serve_runs_with_search_r1s_flags(bm25_index, corpus_path, tmp_path):
    """Search-R1's command line (BM25 index directory) serves; a bare FAISS file is exit 2 naming import_index."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "retrieval_server.serve", "--index_path", str(bm25_index),
                             "--corpus_path", str(corpus_path), "--topk", "2", "--retriever_name", "bm25",
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            assert proc.poll() is None, "the server exited"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        answer = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["river"]}).json()
        assert len(answer["result"][0]) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    faiss_file = tmp_path / "e5_Flat.index"
    faiss_file.write_bytes(b"x")
    done = subprocess.run([sys.executable, "-m", "retrieval_server.serve", "--index_path", str(faiss_file),
                           "--corpus_path", str(corpus_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "retrieval_server.import_index --faiss" in done.stderr
