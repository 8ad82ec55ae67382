"""A build or import that fails leaves the index already in ``--out`` byte for byte
(``retrieval_server/index/staging.py``).

Guards against the data losses of the bad-input run: ``build_index --index auto`` with a budget that holds no
candidate, and ``import_index`` of a corrupt FAISS file, both given ``--out`` pointing at a good index, deleted that
index's ``manifest.json`` before failing, so it could no longer be served. Each case runs the command's ``main``
over a copy of a real index, fails on purpose mid-build (after the staging directory exists), and compares every
file's bytes before and after; the last case checks that a successful rebuild does replace the index.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from retrieval_server.index import build, import_faiss
from retrieval_server.index.manifest import MANIFEST_NAME, Manifest

pytestmark = pytest.mark.slow  # encoders and FAISS builds


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, by path relative to it."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir())


@pytest.fixture
def good(flat_index, tmp_path) -> Path:
    """A copy of a real flat index: the user's good index that a failed command must leave alone."""
    out = tmp_path / "good"
    shutil.copytree(flat_index, out)
    return out


def test_auto_with_a_budget_that_holds_no_candidate(good, flat_index, corpus_path, capsys):
    before, names = digest(good), siblings(good)
    code = build.main(["--corpus", str(corpus_path), "--out", str(good), "--index", "auto", "--from-flat",
                             str(flat_index), "--target-recall", "0.9", "--memory-budget", "0.0000001"])
    assert code == 2
    assert digest(good) == before and siblings(good) == names


def test_a_shard_build_whose_encoder_does_not_load(good, corpus_path, tmp_path):
    broken = tmp_path / "encoder"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert", "hidden_')
    before, names = digest(good), siblings(good)
    code = build.main(["--corpus", str(corpus_path), "--out", str(good), "--shards", "2", "--model",
                             str(broken)])
    assert code == 2
    assert digest(good) == before and siblings(good) == names


def test_import_of_a_corrupt_faiss_file(good, corpus_path, tmp_path):
    corrupt = tmp_path / "e5_Flat.index"
    corrupt.write_bytes((good / "faiss.index").read_bytes()[:1000])
    before, names = digest(good), siblings(good)
    for shards in ("1", "2"):
        code = import_faiss.main(["--faiss", str(corrupt), "--corpus", str(corpus_path), "--out", str(good),
                                  "--shards", shards])
        assert code == 2
        assert digest(good) == before and siblings(good) == names


def test_a_bm25_build_over_a_dense_index_that_fails_on_a_bad_line(good, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "contents": "x"}\n{"id": "b", "contents": 7}\n')
    before, names = digest(good), siblings(good)
    assert build.main(["--corpus", str(corpus), "--out", str(good), "--retriever", "bm25"]) == 2
    assert digest(good) == before and siblings(good) == names


def test_a_successful_rebuild_replaces_the_index_and_leaves_no_staging(good, corpus_path):
    names = siblings(good)
    assert build.main(["--corpus", str(corpus_path), "--out", str(good), "--retriever", "bm25"]) == 0
    assert Manifest.load(good).retriever == "bm25" and (good / MANIFEST_NAME).exists()
    assert siblings(good) == names
