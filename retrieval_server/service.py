"""Loading an index directory into a ready-to-query search service (used by the server and benchmarks).

Choices:
- ``load_service`` does every check before the first query: the corpus checksum (in the same pass
  that records line offsets), then the encoder fingerprint (dense), then one warm-up query so that
  numba compilation, first-call allocations and the first read of a memory-mapped index are not
  paid by a client.
- Both retrievers expose ``search(queries, k) -> (scores [B, k], row ids [B, k])``. The service puts
  the optional cross-encoder stage after the retriever and the deduplicating cache in front of both
  (``query_cache.py``: a cached answer is the final, reranked one), then turns row ids into passages
  (their corpus lines, as raw JSON). ``k`` is capped at the index's size. Equal scores come in ascending
  corpus row order (``_retrieve``).
- A row-range shard (``shards.py``) is served with the whole corpus: its row ids are moved by the
  shard's start before passages are fetched, and ``describe`` (``/health``) says which rows it holds,
  the corpus checksum and a hash of the encoder fingerprint, so a client can check a set of shards.
- ``ServeOptions`` holds every serving choice, typed and validated once, here; ``serve.py`` fills it
  from the command line.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from retrieval_server.bm25 import BM25Retriever
from retrieval_server.corpus import CorpusStore, scan_corpus
from retrieval_server.encoder import ENCODER_BACKENDS, ENCODER_DTYPES
from retrieval_server.manifest import Manifest, check_corpus, check_encoder
from retrieval_server.query_cache import CachedSearch

logger = logging.getLogger(__name__)

Hit = tuple[bytes, float, int]  # (the passage's corpus line: a JSON object {"id", "contents"}, score, corpus row)
# How a FAISS GPU build spreads a flat / IVF index over the visible GPUs (dense.place_on_gpus).
GPU_MODES = ("shard", "replicate", "off")


@dataclass(frozen=True)
class ServeOptions:
    """How an index is served (the index itself is described by its manifest)."""

    model: str | None = None  # encoder path overriding the manifest's (must embed identically)
    threads: int = 0  # CPU threads of torch, FAISS and numba; 0 = library default
    encoder_dtype: str = "auto"  # one of ENCODER_DTYPES (encoder.py says what auto picks)
    encoder_backend: str = "auto"  # one of ENCODER_BACKENDS: auto = ONNX Runtime on a CPU in fp32, else torch
    cache_size: int = 65536  # (query, k) answers kept by the LRU cache; 0 = off (repeats in a batch still merge)
    reranker: str | None = None  # cross-encoder directory; None = no rerank stage
    rerank_topk: int = 10  # candidates the reranker rescores per query (at least the request's topk)
    gpu_mode: str = "shard"  # one of GPU_MODES: how a FAISS GPU build spreads the index over the GPUs
    gpu_fp16: bool = False  # FAISS GPU: store the vectors in fp16
    gpu_budget_gb: float | None = None  # FAISS GPU: most GiB of each GPU the index may take; None = no limit

    def __post_init__(self) -> None:
        if self.encoder_dtype not in ENCODER_DTYPES:
            raise ValueError(f"encoder dtype must be one of {ENCODER_DTYPES}, got {self.encoder_dtype!r}")
        if self.encoder_backend not in ENCODER_BACKENDS:
            raise ValueError(f"encoder backend must be one of {ENCODER_BACKENDS}, got {self.encoder_backend!r}")
        if self.gpu_mode not in GPU_MODES:
            raise ValueError(f"FAISS GPU mode must be one of {GPU_MODES}, got {self.gpu_mode!r}")
        if self.gpu_budget_gb is not None and not 0 < self.gpu_budget_gb < float("inf"):
            raise ValueError(f"--faiss-gpu-memory-gb must be a positive number of GiB, got {self.gpu_budget_gb}")
        for name, value, least in (("threads", self.threads, 0), ("cache size", self.cache_size, 0),
                                   ("rerank topk", self.rerank_topk, 1)):
            if value < least:
                raise ValueError(f"{name} must be at least {least}, got {value}")


class BackendError(RuntimeError):
    """A backend that searches elsewhere (an online engine, ``online/backend.py``) could not answer: the app answers
    ``status`` with ``{"detail": message, "retryable": retryable}``; ``retryable`` false tells a client that waiting
    will not help (a spent budget, a refused key)."""

    def __init__(self, status: int, message: str, retryable: bool = True):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retryable = retryable


class Retriever(Protocol):
    num_passages: int

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` and row ids ``[B, k]`` (-1 = no hit), best first."""
        ...


def load_retriever(index_dir: str | Path, manifest: Manifest, options: ServeOptions = ServeOptions()) -> Retriever:
    """The retriever the manifest describes, with the encoder, threads and GPU placement of ``options``."""
    if manifest.retriever == "bm25":
        return BM25Retriever.load(index_dir, options.threads)
    import faiss

    from retrieval_server.dense import DenseRetriever
    from retrieval_server.encoder import Encoder

    if options.threads > 0:
        import torch

        torch.set_num_threads(options.threads)
        faiss.omp_set_num_threads(options.threads)
    encoder = Encoder(options.model or manifest.model, manifest.query_prefix, manifest.passage_prefix,
                      dtype=options.encoder_dtype, backend=options.encoder_backend, threads=options.threads)
    check_encoder(manifest, index_dir, encoder.name, encoder.fingerprint())
    return DenseRetriever.load(manifest.index_path(index_dir), manifest.index, manifest.index_params, encoder,
                               options.gpu_mode, options.gpu_fp16, options.gpu_budget_gb)


def probe_hash(probe: list[float] | None) -> str | None:
    """A short hash of the manifest's encoder fingerprint (None: BM25), for clients to compare endpoints."""
    return None if probe is None else hashlib.sha256(json.dumps(probe).encode()).hexdigest()[:12]


class SearchService:
    """A retriever (plus optional reranker) and the corpus it indexes: queries in, passages (with scores) out."""

    def __init__(self, retriever: Retriever, corpus: CorpusStore, manifest: Manifest,
                 options: ServeOptions = ServeOptions(), reranker=None, index_dir: str | Path | None = None):
        self.retriever = retriever
        self.corpus = corpus
        self.manifest = manifest
        self.index_dir = None if index_dir is None else Path(index_dir).resolve()  # where it was loaded from
        self.options = options
        self.reranker = reranker  # rerank.Reranker or None
        self.cache = CachedSearch(self._search_distinct, options.cache_size)
        self.row_offset = manifest.shard["start"] if manifest.shard else 0  # corpus row of the index's row 0

    @property
    def num_passages(self) -> int:
        """Passages this index holds (a shard: its rows)."""
        return self.retriever.num_passages

    def _retrieve(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The retriever's scores ``[B, k]`` and corpus rows ``[B, k]`` (a shard's row ids moved by its start), equal
        scores by ascending row: FAISS returns exact ties in descending row order, the client merges shards' hits
        in ascending row order, and both must agree."""
        scores, rows = self.retriever.search(queries, k)
        rows = np.where(rows >= 0, rows + self.row_offset, rows)
        order = np.lexsort((rows, -scores), axis=-1)  # [B, k]: by score descending, then row ascending
        return np.take_along_axis(scores, order, -1), np.take_along_axis(rows, order, -1)

    def _search_distinct(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Retriever, then reranker: scores ``[B, k]`` and corpus rows ``[B, k]`` of distinct queries."""
        if self.reranker is None:
            return self._retrieve(queries, k)
        n_candidates = min(max(k, self.options.rerank_topk), self.num_passages)
        _, rows = self._retrieve(queries, n_candidates)  # [B, n_candidates]
        return self.reranker.rerank(queries, rows, self.corpus.fetch(rows), k)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top ``min(k, num_passages)`` hits per query, best first (fewer where an ANN index finds fewer)."""
        scores, rows = self.cache.search(queries, min(k, self.num_passages))  # [B, k], [B, k]
        docs_per_query = self.corpus.fetch(rows)
        found = rows >= 0  # [B, k]; False where an approximate index found fewer than k
        if found.all():
            scores_per_query, rows_per_query = scores.tolist(), rows.tolist()
        else:
            scores_per_query = [s[f].tolist() for s, f in zip(scores, found, strict=True)]
            rows_per_query = [r[f].tolist() for r, f in zip(rows, found, strict=True)]
        return [list(zip(docs, s, r, strict=True))
                for docs, s, r in zip(docs_per_query, scores_per_query, rows_per_query, strict=True)]

    def warm_up(self) -> None:
        """One query through retriever and reranker (not the cache, whose counters start at 0)."""
        self._search_distinct(["warm-up query"], 1)

    def describe(self) -> dict:
        """What is served (for ``GET /health``); ``recall``: tuning.served_recall (null where not measured)."""
        dense = self.manifest.retriever == "dense"
        if dense:  # both modules import FAISS, which a BM25 service runs without (a machine may lack it)
            from retrieval_server.index_kinds import search_params
            from retrieval_server.tuning import served_recall

        encoder = getattr(self.retriever, "encoder", None)
        return {"retriever": self.manifest.retriever, "index": self.manifest.index, "model": self.manifest.model,
                # where the served files are, so a run's retrieval.json names them (the hashes say what they hold)
                "corpus_path": str(Path(self.corpus.scan.path).resolve()),
                "index_path": None if self.index_dir is None else str(self.index_dir),
                "index_kind": self.manifest.index or self.manifest.retriever,  # a FAISS kind, or bm25
                "encoder_dtype": encoder.dtype if encoder is not None else None,
                "encoder_backend": encoder.backend if encoder is not None else None,
                "corpus_sha256": self.manifest.corpus_sha256, "passages": len(self.corpus),
                "probe_sha256": probe_hash(self.manifest.probe), "shard": self.manifest.shard,
                # a BM25 index's parameters (k1, b, ...) hold none of the search parameters (nprobe, efSearch, k_factor)
                "search_params": search_params(self.manifest.index_params) if dense else {},
                "recall": served_recall(self.manifest.index_params) if dense else None,
                "cache_size": self.options.cache_size,
                "reranker": self.options.reranker, "rerank_topk": self.options.rerank_topk if self.reranker else None}

    def stats(self) -> dict:
        """Counters of the deduplicating cache (for ``GET /stats``)."""
        return asdict(self.cache.stats())

    def summary(self) -> str | None:
        """A line of the backend's own totals for the summary log line (a local index has none)."""
        return None

    def close(self) -> None:
        self.corpus.close()


def check_gpu_placement(manifest: Manifest, options: ServeOptions) -> None:
    """Before loading: ``ValueError`` (naming the need and the ways out) when the dense index of ``manifest`` would
    take more than ``options.gpu_budget_gb`` of a GPU; nothing to check on CPU or for a refined index (it stays on
    CPU)."""
    if manifest.retriever != "dense" or options.gpu_budget_gb is None or \
            manifest.index_params.get("refine", "none") != "none":
        return
    import faiss

    from retrieval_server.dense import check_gpu_budget

    check_gpu_budget(manifest.index, manifest.dim, manifest.count, faiss.get_num_gpus(), options.gpu_mode,
                     options.gpu_fp16, options.gpu_budget_gb)


def load_service(index_dir: str | Path, corpus: str | Path, options: ServeOptions = ServeOptions()) -> SearchService:
    """Verify the index against ``corpus`` and the encoder, load it (and the reranker), and warm it up.

    Raises ``ManifestError`` saying which of corpus / encoder does not match.
    """
    manifest = Manifest.load(index_dir)
    logger.info("scanning corpus %s", corpus)
    scan = scan_corpus(corpus)
    check_corpus(manifest, index_dir, scan)
    logger.info("loading %s index from %s (%d passages)", manifest.retriever, index_dir, manifest.count)
    retriever = load_retriever(index_dir, manifest, options)
    if retriever.num_passages != manifest.count:
        raise RuntimeError(f"index {index_dir} holds {retriever.num_passages} passages, manifest says {manifest.count}")
    reranker = None
    if options.reranker is not None:
        from retrieval_server.rerank import Reranker

        encoder = getattr(retriever, "encoder", None)
        reranker = Reranker(options.reranker, device=str(encoder.model.device) if encoder is not None else None)
    service = SearchService(retriever, CorpusStore(scan), manifest, options, reranker, index_dir)
    service.warm_up()
    logger.info("index ready")
    return service
