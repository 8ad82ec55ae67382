"""FAISS index building (flat / HNSW / IVF, streamed in batches) against a brute-force loop."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from retrieval_server.build_index import build_index
from retrieval_server.dense import build_dense_index
from retrieval_server.encoder import DEFAULT_MODEL, Encoder
from retrieval_server.manifest import INDEX_FILE, Manifest
from retrieval_server.service import load_retriever
from tests.retrieval_server.retrieval_test_corpus import PASSAGES


def _unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute_force_topk(passages: np.ndarray, queries: np.ndarray, k: int) -> list[list[int]]:
    """Plain loop: score every passage by inner product, keep the k best."""
    out = []
    for q in queries:
        scores = []
        for i, p in enumerate(passages):
            scores.append((sum(float(a) * float(b) for a, b in zip(q, p, strict=True)), i))
        scores.sort(key=lambda s: -s[0])
        out.append([i for _, i in scores[:k]])
    return out


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_streamed_build_searches_like_brute_force(kind):
    """Guards against batches added out of order or dropped while streaming (row ids would point at the wrong
    passages) and against IVF training on a partial sample losing the vectors it trained on."""
    passages, queries = _unit_vectors(600, 16, 0), _unit_vectors(20, 16, 1)
    batches = (passages[i:i + 64] for i in range(0, len(passages), 64))
    index, params = build_dense_index(batches, kind, dim=16, count=len(passages))
    assert index.ntotal == 600
    if kind == "ivf":
        assert params["nlist"] == 600 // 39 and params["nprobe"] == params["nlist"]  # every list probed: exact
        index.nprobe = params["nprobe"]
    if kind == "hnsw":
        index.hnsw.efSearch = params["efSearch"]
    _, ids = index.search(queries, 10)
    expected = _brute_force_topk(passages, queries, 10)
    if kind == "hnsw":  # approximate: high recall, not exact
        recall = np.mean([len(set(row) & set(ref)) / 10 for row, ref in zip(ids.tolist(), expected, strict=True)])
        assert recall >= 0.95
    else:
        assert ids.tolist() == expected


def test_wrong_embedding_count_is_an_error():
    """Guards against an index silently shorter than the corpus (the last passages would be unreachable)."""
    with pytest.raises(ValueError, match="expected 10 embeddings, got 8"):
        build_dense_index([_unit_vectors(8, 4, 0)], "flat", dim=4, count=10)


def test_hnsw_from_flat_reuses_the_vectors(flat_index, corpus_path, tmp_path):
    """Guards against --from-flat re-encoding (or mis-ordering) the corpus, or dropping the encoder fingerprint."""
    manifest = build_index(corpus_path, tmp_path, retriever="dense", index="hnsw", from_flat=flat_index,
                           progress=False)
    flat_manifest = Manifest.load(flat_index)
    assert manifest.index == "hnsw" and manifest.probe == flat_manifest.probe and manifest.model == flat_manifest.model
    flat = faiss.read_index(str(flat_index / INDEX_FILE))
    hnsw = faiss.read_index(str(tmp_path / INDEX_FILE))
    np.testing.assert_array_equal(hnsw.reconstruct_n(0, hnsw.ntotal), flat.reconstruct_n(0, flat.ntotal))


def test_e5_prefixes_are_recorded_and_applied_to_queries(corpus_path, tmp_path):
    """Guards against e5-style prefixes applied to passages at build time but not to queries at serve time
    (or the reverse), which silently degrades every search."""
    manifest = build_index(corpus_path, tmp_path, retriever="dense", e5_prefixes=True, progress=False)
    assert (manifest.query_prefix, manifest.passage_prefix) == ("query: ", "passage: ")
    retriever = load_retriever(tmp_path, manifest)
    queries = ["a harbour town with a lighthouse", "who mapped comets"]
    _, ids = retriever.search(queries, 5)
    plain = Encoder(DEFAULT_MODEL)  # no prefixes: the test adds them by hand
    passages = plain.encode_passages([f'passage: "{title}"\n{text}' for _, title, text in PASSAGES])
    expected = _brute_force_topk(passages, plain.encode_queries([f"query: {q}" for q in queries]), 5)
    assert ids.tolist() == expected
