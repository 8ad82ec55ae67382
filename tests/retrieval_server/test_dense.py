"""FAISS index building (flat / HNSW / IVF, streamed in batches) against a brute-force loop."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from retrieval_server.index.build import build_index
from retrieval_server.index.dense import build_dense_index
from retrieval_server.index.encoder import DEFAULT_MODEL, Encoder
from retrieval_server.index.manifest import INDEX_FILE, Manifest
from retrieval_server.search.service import load_retriever
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


@pytest.mark.slow  # builds an index with an encoder
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


@pytest.mark.parametrize("kind,fp16,per_vector", [("flat", False, 4 * 768), ("flat", True, 2 * 768),
                                                  ("ivf", True, 2 * 768 + 8), ("sq8", True, 768),
                                                  ("ivfpq", False, 96 + 8)])
def test_gpu_memory_per_gpu_is_the_stored_vectors_share(kind, fp16, per_vector):
    """Guards the GPU budget's arithmetic (no GPU here, so the placement itself is unmeasured): 21M wiki-18 vectors
    of e5-base sharded over 8 GPUs hold ceil(21M / 8) rows each; replicated, all of them; fp16 halves only the
    flat / IVF-flat vectors (an SQ8 or PQ code is the same size on GPU)."""
    from retrieval_server.search.dense import gpu_bytes_per_gpu

    rows = 21_000_017  # not a multiple of 8: a shard holds the rounded-up share
    assert gpu_bytes_per_gpu(kind, 768, rows, 8, "shard", fp16) == per_vector * 2_625_003
    assert gpu_bytes_per_gpu(kind, 768, rows, 8, "replicate", fp16) == per_vector * rows


def test_an_index_over_the_gpu_budget_is_refused_naming_the_need_and_the_ways_out():
    """Guards against a retriever that takes the GPU memory training needs: a flat wiki-18 index (64.5 GB) sharded
    over 4 GPUs needs 15.02 GiB each; with 10 GiB left for it the placement is refused, naming fp16 (7.51 GiB
    fits) and the other ways out; CPU-only placements (no GPU, --faiss-gpu off, HNSW) are never refused."""
    from retrieval_server.search.dense import check_gpu_budget

    need = 4 * 768 * 21_000_000 / 4 / 2**30
    with pytest.raises(ValueError) as err:
        check_gpu_budget("flat", 768, 21_000_000, 4, "shard", False, 10)
    message = str(err.value)
    assert f"{need:.2f} GiB on each of 4 GPU(s)" in message and "--faiss-gpu-memory-gb 10" in message
    assert "--faiss-gpu-fp16" in message and "--faiss-gpu off" in message
    check_gpu_budget("flat", 768, 21_000_000, 4, "shard", True, 10)  # fp16: 7.51 GiB fits
    with pytest.raises(ValueError, match="--faiss-gpu shard"):
        check_gpu_budget("flat", 768, 21_000_000, 4, "replicate", True, 10)
    for n_gpus, mode, kind in ((0, "shard", "flat"), (4, "off", "flat"), (4, "shard", "hnswsq8")):
        check_gpu_budget(kind, 768, 21_000_000, n_gpus, mode, False, 1)
    check_gpu_budget("flat", 768, 21_000_000, 4, "shard", False, None)  # no budget given: no limit


@pytest.mark.slow  # starts two servers
def test_gpu_budget_option_is_checked_and_a_cpu_service_is_unaffected(flat_index, corpus_path):
    """--faiss-gpu-memory-gb: a non-positive value exits 2 naming the option; on a machine without GPUs a budget
    changes nothing (the index is searched on CPU)."""
    import httpx

    from retrieval_server.launcher import ServerProcess

    with ServerProcess(flat_index, corpus_path, ["--faiss-gpu-memory-gb", "0"]) as server:
        assert server.wait_exit(timeout=60) == 2
        assert "--faiss-gpu-memory-gb must be a positive number" in server.log_text()
    with ServerProcess(flat_index, corpus_path, ["--faiss-gpu-memory-gb", "0.001"]) as server:
        server.wait_ready()
        found = httpx.post(server.url + "/retrieve", json={"queries": ["anything"], "topk": 2}, timeout=60).json()
        assert len(found["result"][0]) == 2
