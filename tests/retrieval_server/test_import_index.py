"""import_index: a FAISS index built outside our builder (raw FAISS + corpus, Search-R1's layout) is served like
our own build; every checkable mismatch is refused with a message naming it; the vectors are memory-mapped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest

from retrieval_server.index.encoder import DEFAULT_MODEL, E5_PASSAGE_PREFIX
from retrieval_server.index.import_faiss import import_index
from retrieval_server.index.manifest import MANIFEST_NAME, Manifest, ManifestError
from retrieval_server.launcher import ServerProcess
from tests.retrieval_server.retrieval_test_corpus import PASSAGES

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

CONTENTS = [f'"{title}"\n{text}' for _, title, text in PASSAGES]
QUERIES = ["Which river flows into the Sallow Sea?", "who made glass in Kelbrook", "cheese aged in caves",
           "a telescope made of brass", "folk songs about ferrymen", "the clock that chimes thirteen times"]


@pytest.fixture(scope="module")
def passage_vectors() -> np.ndarray:
    """``[N, 384]`` unit vectors of the test corpus, encoded the way another tool would: sentence-transformers
    directly, not our Encoder."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(DEFAULT_MODEL, device="cpu")
    return model.encode(CONTENTS, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)


def _write(index: faiss.Index, vectors: np.ndarray, path: Path) -> Path:
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))
    return path


@pytest.fixture(scope="module")
def raw_flat(passage_vectors, tmp_path_factory) -> Path:
    """An e5_Flat.index-style file: IndexFlatIP, row i = line i of the corpus."""
    return _write(faiss.IndexFlatIP(passage_vectors.shape[1]), passage_vectors,
                  tmp_path_factory.mktemp("raw") / "e5_Flat.index")


def _served(server: ServerProcess) -> list[list[tuple[str, float]]]:
    result = httpx.post(server.url + "/retrieve", json={"queries": QUERIES, "topk": 5, "return_scores": True},
                        timeout=60).json()["result"]
    return [[(hit["document"]["id"], hit["score"]) for hit in hits] for hits in result]


def test_imported_raw_faiss_index_serves_what_our_build_serves(raw_flat, corpus_path, flat_server, tmp_path):
    """Guards against an imported index being read with another row -> passage mapping, other prefixes or another
    encoder than the one that built it (the service would answer with plausible but wrong passages)."""
    manifest = import_index(raw_flat, corpus_path, tmp_path, progress=False)
    assert (manifest.index, manifest.index_file, manifest.count) == ("flat", str(raw_flat), len(PASSAGES))
    assert manifest.index_params["import_check"]["rank1"] == len(PASSAGES)  # a 20-passage sample is every row
    assert list(tmp_path.iterdir()) == [tmp_path / MANIFEST_NAME]  # the FAISS file is not copied
    with ServerProcess(tmp_path, corpus_path, ["--threads", "1", "--encoder-dtype", "fp32"]) as server:
        health = server.wait_ready()
        assert (health["index"], health["passages"], health["encoder_dtype"]) == ("flat", len(PASSAGES), "fp32")
        imported = _served(server)
    ours = _served(flat_server)
    assert [[doc for doc, _ in hits] for hits in imported] == [[doc for doc, _ in hits] for hits in ours]
    np.testing.assert_allclose([[s for _, s in hits] for hits in imported], [[s for _, s in hits] for hits in ours],
                               rtol=1e-5, atol=1e-6)


def test_imported_hnsw_index_keeps_its_search_parameters(passage_vectors, corpus_path, tmp_path):
    """Guards against an imported HNSW index being refused as a foreign type or served with another efSearch
    than it was written with."""
    index = faiss.IndexHNSWFlat(passage_vectors.shape[1], 8, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = 40
    raw = _write(index, passage_vectors, tmp_path / "e5_HNSW.index")
    manifest = import_index(raw, corpus_path, tmp_path / "out", progress=False)
    assert (manifest.index, manifest.index_params["efSearch"]) == ("hnsw", 40)
    assert Manifest.load(tmp_path / "out").index_path(tmp_path / "out") == raw


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


MISMATCHES = {  # name -> (index and vectors to write, fragment of the refusal)
    "one vector missing": (lambda v: (faiss.IndexFlatIP(v.shape[1]), v[:-1]), "count mismatch: .* holds 19 vectors"),
    "other dimension": (lambda v: (faiss.IndexFlatIP(32), _unit(v[:, :32])), "dimension mismatch.*dimension 32"),
    "L2 metric": (lambda v: (faiss.IndexFlatL2(v.shape[1]), v), "not inner product"),
    "rows in another order": (lambda v: (faiss.IndexFlatIP(v.shape[1]), np.roll(v, 1, axis=0)),
                              r"index mismatch: only 0 of 20 .*row i = passage i"),
    "unnormalised vectors": (lambda v: (faiss.IndexFlatIP(v.shape[1]), 3 * v), "not unit length"),
    "compressed vectors": (lambda v: (faiss.IndexScalarQuantizer(v.shape[1], faiss.ScalarQuantizer.QT_8bit,
                                                                 faiss.METRIC_INNER_PRODUCT), v),
                           "is a sq8 index, whose vectors are compressed"),
}


@pytest.mark.parametrize("name", MISMATCHES)
def test_mismatched_index_is_refused_and_leaves_out_as_it_was(name, passage_vectors, corpus_path, tmp_path):
    """Guards against importing an index that cannot serve this corpus with this encoder (wrong row count, size,
    metric, order, scale or a lossy type): it would start and answer with wrong passages. A refused import leaves
    what --out held as it was (it once deleted the manifest of the index there)."""
    make, fragment = MISMATCHES[name]
    index, vectors = make(passage_vectors)
    if isinstance(index, faiss.IndexScalarQuantizer):
        index.train(vectors)
    raw = _write(index, vectors, tmp_path / "other.index")
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST_NAME).write_text("{}")  # an earlier import's manifest stays as it was
    with pytest.raises(ManifestError, match=fragment):
        import_index(raw, corpus_path, out, progress=False)
    assert (out / MANIFEST_NAME).read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.index", "out"]  # no staging directory left


def test_wrong_prefix_setting_is_named(corpus_path, tmp_path):
    """Guards against importing an e5-style index (passages encoded with 'passage: ') without --e5-prefixes, or
    the reverse: every query would then be encoded unlike the passages."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(DEFAULT_MODEL, device="cpu")
    prefixed = model.encode([E5_PASSAGE_PREFIX + c for c in CONTENTS], normalize_embeddings=True)
    raw = _write(faiss.IndexFlatIP(prefixed.shape[1]), prefixed, tmp_path / "e5.index")
    with pytest.raises(ManifestError, match="prefix mismatch.*add --e5-prefixes"):
        import_index(raw, corpus_path, tmp_path / "a", progress=False)
    manifest = import_index(raw, corpus_path, tmp_path / "b", e5_prefixes=True, progress=False)
    assert (manifest.query_prefix, manifest.passage_prefix) == ("query: ", "passage: ")


def test_imported_file_replaced_later_is_refused_before_binding(passage_vectors, corpus_path, tmp_path):
    """Guards against serving a FAISS file that was replaced after the import (its rows were never checked)."""
    raw = _write(faiss.IndexFlatIP(passage_vectors.shape[1]), passage_vectors, tmp_path / "e5_Flat.index")
    import_index(raw, corpus_path, tmp_path / "out", progress=False)
    _write(faiss.IndexFlatIP(passage_vectors.shape[1]), passage_vectors[:-1], raw)
    with ServerProcess(tmp_path / "out", corpus_path) as server:
        assert server.wait_exit(timeout=60) == 2
        assert "index mismatch" in server.log_text() and "Uvicorn running" not in server.log_text()


RSS_SCRIPT = """
import sys, numpy as np
from retrieval_server.index.dense import read_index
def anon_kb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1])
before = anon_kb()
index = read_index(sys.argv[1])
loaded = anon_kb()
index.search(np.ones((1, index.d), dtype=np.float32), 3)  # touches every vector
print(loaded - before, anon_kb() - before)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_large_index_is_memory_mapped_not_copied(tmp_path):
    """Guards against loading a flat index into private memory (a 60 GB wiki-18 index would need 60 GB of RAM
    per server): its pages must be file-backed, so private memory stays far below the index size."""
    n, dim = 100_000, 96  # 38 MB of vectors
    vectors = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    path = _write(faiss.IndexFlatIP(dim), vectors, tmp_path / "big.index")
    done = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    after_load_kb, after_search_kb = map(int, done.stdout.split())
    index_kb = n * dim * 4 // 1024
    assert after_load_kb < index_kb / 4 and after_search_kb < index_kb / 4, (after_load_kb, after_search_kb, index_kb)
