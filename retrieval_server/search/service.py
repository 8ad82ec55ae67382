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
- A row-range shard (``index/shards.py``) is served with the whole corpus: its row ids are moved by the
  shard's start before passages are fetched, and ``describe`` (``/health``) says which rows it holds,
  the corpus checksum and a hash of the encoder fingerprint, so a client can check a set of shards.
- ``ServeOptions`` holds every serving choice, typed and validated once, here; ``serve/cli.py`` fills it
  from the command line.
- Devices (``devices.py``): nothing goes on a GPU unless asked (``encoder_device``, default cpu, for the encoder and
  the re-ranker; ``gpu_mode``, default off, for a FAISS index). ``plan_devices`` checks, before loading, that what is
  asked can be done here; ``load_service`` measures the device memory each part took, logs it in the ready line and
  ``describe`` (``/health``) reports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from retrieval_server.index.corpus import CorpusStore, scan_corpus
from retrieval_server.index.encoder import ENCODER_BACKENDS, ENCODER_DTYPES
from retrieval_server.index.manifest import Manifest, check_corpus, check_encoder
from retrieval_server.search.devices import (
    Placement,
    check_cuda_device,
    check_device_name,
    describe_placements,
    measured,
    visible_gpus_note,
)
from retrieval_server.search.query_cache import CachedSearch

logger = logging.getLogger(__name__)

Hit = tuple[bytes, float, int]  # (the passage's corpus line: a JSON object {"id", "contents"}, score, corpus row)
# Whether and how a FAISS GPU build spreads a flat / IVF index over the visible GPUs (dense.place_on_gpus).
GPU_MODES = ("off", "shard", "replicate")


@dataclass(frozen=True)
class ServeOptions:
    """How an index is served (the index itself is described by its manifest)."""

    model: str | None = None  # encoder path overriding the manifest's (must embed identically)
    threads: int = 0  # CPU threads of torch, FAISS and numba; 0 = library default
    encoder_dtype: str = "auto"  # one of ENCODER_DTYPES (index/encoder.py says what auto picks)
    encoder_backend: str = "auto"  # one of ENCODER_BACKENDS: auto = ONNX Runtime on a CPU in fp32, else torch
    cache_size: int = 65536  # (query, k) answers kept by the LRU cache; 0 = off (repeats in a batch still merge)
    reranker: str | None = None  # cross-encoder directory; None = no rerank stage
    rerank_topk: int = 10  # candidates the reranker rescores per query (at least the request's topk)
    encoder_device: str = "cpu"  # the query encoder's and the re-ranker's device: cpu, cuda or cuda:N
    gpu_mode: str = "off"  # one of GPU_MODES: whether and how a FAISS GPU build puts the index on the GPUs
    gpu_fp16: bool = False  # FAISS GPU: store the vectors in fp16
    gpu_budget_gb: float | None = None  # FAISS GPU: most GiB of each GPU the index may take; None = no limit

    def __post_init__(self) -> None:
        if self.encoder_dtype not in ENCODER_DTYPES:
            raise ValueError(f"encoder dtype must be one of {ENCODER_DTYPES}, got {self.encoder_dtype!r}")
        if self.encoder_backend not in ENCODER_BACKENDS:
            raise ValueError(f"encoder backend must be one of {ENCODER_BACKENDS}, got {self.encoder_backend!r}")
        object.__setattr__(self, "encoder_device", check_device_name("--encoder-device", self.encoder_device))
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
    placements: list[Placement]  # where its parts run (index, encoder) and what they took: set by load_retriever

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` and row ids ``[B, k]`` (-1 = no hit), best first."""
        ...


def load_retriever(index_dir: str | Path, manifest: Manifest, options: ServeOptions = ServeOptions(),
                   plan: list[Placement] | None = None) -> Retriever:
    """The retriever the manifest describes, with the encoder, threads and device placement of ``options`` (``plan``:
    ``plan_devices``'s answer, where the caller has it); its ``placements`` say where the index and the encoder run
    and the device memory each took."""
    plan = {p.part: p for p in plan or plan_devices(manifest, options)}
    if manifest.retriever == "bm25":
        from retrieval_server.search.bm25 import BM25Retriever  # bm25s, numba, SciPy: ~0.3 s a start, BM25 only

        retriever = BM25Retriever.load(index_dir, options.threads)
        plan["index"].device_bytes = 0
        retriever.placements = [plan["index"]]
        return retriever
    import faiss

    from retrieval_server.index.encoder import Encoder
    from retrieval_server.search.dense import DenseRetriever

    if options.threads > 0:  # the encoder sets torch's, where it loads torch (not from a cached ONNX bundle)
        faiss.omp_set_num_threads(options.threads)
    with measured(plan["encoder"]):
        encoder = Encoder(options.model or manifest.model, manifest.query_prefix, manifest.passage_prefix,
                          device=options.encoder_device, dtype=options.encoder_dtype, backend=options.encoder_backend,
                          threads=options.threads)
    check_encoder(manifest, index_dir, encoder.name, encoder.fingerprint())
    retriever = DenseRetriever.load(manifest.index_path(index_dir), manifest.index, manifest.index_params, encoder,
                                    plan["index"], options.gpu_mode, options.gpu_fp16, options.gpu_budget_gb)
    retriever.placements = [plan["index"], plan["encoder"]]
    return retriever


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
            from retrieval_server.index.kinds import search_params
            from retrieval_server.index.tuning import served_recall

        encoder = getattr(self.retriever, "encoder", None)
        parts = {p.part: p.as_dict() for p in self.placements()}
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
                "reranker": self.options.reranker, "rerank_topk": self.options.rerank_topk if self.reranker else None,
                # where each part runs and the device memory it took (devices.py); null: the service has no such part
                "devices": {part: parts.get(part) for part in ("index", "encoder", "reranker")},
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def placements(self) -> list[Placement]:
        """Where the index, the encoder and the re-ranker (those the service has) run, and what each took."""
        return self.retriever.placements + ([self.reranker.placement] if self.reranker is not None else [])

    def stats(self) -> dict:
        """Counters of the deduplicating cache (for ``GET /stats``)."""
        return asdict(self.cache.stats())

    def summary(self) -> str | None:
        """A line of the backend's own totals for the summary log line (a local index has none)."""
        return None

    def close(self) -> None:
        self.corpus.close()


def plan_devices(manifest: Manifest, options: ServeOptions) -> list[Placement]:
    """Before loading: where each part of the service will run (``Placement``s, memory not yet known). ``ValueError``
    naming the flag when a device asked for cannot be used here (a GPU this process does not see, FAISS without
    GPUs) or when the dense index would take more than ``options.gpu_budget_gb`` of a GPU. Flags that place nothing
    here (``--faiss-gpu`` for BM25, ``--encoder-device`` for BM25 without a re-ranker) are logged and ignored."""
    dense = manifest.retriever == "dense"
    if not dense and options.gpu_mode != "off":
        logger.warning("--faiss-gpu %s has no effect: a BM25 index searches on the CPU (the flag places a dense "
                       "FAISS index)", options.gpu_mode)
    if not dense and options.reranker is None and options.encoder_device != "cpu":
        logger.warning("--encoder-device %s has no effect: a BM25 index has no query encoder (the flag places a dense "
                       "index's encoder and the --reranker)", options.encoder_device)
    plan = [_plan_dense_index(manifest, options) if dense else Placement("index", "cpu", "bm25s")]
    if dense or options.reranker is not None:
        check_cuda_device("--encoder-device", options.encoder_device)
    if dense:
        plan.append(Placement("encoder", options.encoder_device))
    if options.reranker is not None:
        plan.append(Placement("reranker", options.encoder_device))
    return plan


def _plan_dense_index(manifest: Manifest, options: ServeOptions) -> Placement:
    """The FAISS index's placement: the CPU unless ``--faiss-gpu`` asks for the GPUs (all visible ones, sharded or
    replicated) and the kind can go there; ``ValueError`` when FAISS sees no GPU or the index is over the budget."""
    if options.gpu_mode == "off":
        return Placement("index", "cpu", "faiss")
    import faiss

    n_gpus = faiss.get_num_gpus()  # 0 with the CPU build
    if n_gpus == 0:
        raise ValueError(f"--faiss-gpu {options.gpu_mode}: FAISS sees no GPU ({visible_gpus_note()}; the CPU build, "
                         "faiss-cpu, never does: pip install faiss-gpu-cu12 for GPU search); leave --faiss-gpu off "
                         "to search on the CPU")
    from retrieval_server.index.kinds import HNSW_KINDS

    if manifest.index in HNSW_KINDS:
        return Placement("index", "cpu", "faiss; FAISS has no GPU HNSW")
    if manifest.index_params.get("refine", "none") != "none":
        return Placement("index", "cpu", "faiss; a refined index stays on the CPU")
    from retrieval_server.search.dense import check_gpu_budget

    check_gpu_budget(manifest.index, manifest.dim, manifest.count, n_gpus, options.gpu_mode, options.gpu_fp16,
                     options.gpu_budget_gb)
    return Placement("index", ",".join(f"cuda:{i}" for i in range(n_gpus)),
                     f"faiss {options.gpu_mode}{', fp16' if options.gpu_fp16 else ''}")


def load_service(index_dir: str | Path, corpus: str | Path, options: ServeOptions = ServeOptions(),
                 plan: list[Placement] | None = None) -> SearchService:
    """Verify the index against ``corpus`` and the encoder, load it (and the reranker) where ``plan`` (``plan_devices``;
    None: made here) places them, and warm it up.

    Raises ``ManifestError`` saying which of corpus / encoder does not match.
    """
    manifest = Manifest.load(index_dir)
    logger.info("scanning corpus %s", corpus)
    scan = scan_corpus(corpus)
    check_corpus(manifest, index_dir, scan)
    logger.info("loading %s index from %s (%d passages)", manifest.retriever, index_dir, manifest.count)
    plan = plan or plan_devices(manifest, options)
    retriever = load_retriever(index_dir, manifest, options, plan)
    if retriever.num_passages != manifest.count:
        raise RuntimeError(f"index {index_dir} holds {retriever.num_passages} passages, manifest says {manifest.count}")
    reranker = None
    if options.reranker is not None:
        from retrieval_server.search.rerank import Reranker

        with measured(next(p for p in plan if p.part == "reranker")) as placement:
            reranker = Reranker(options.reranker, device=options.encoder_device, threads=options.threads)
        reranker.placement = placement
    service = SearchService(retriever, CorpusStore(scan), manifest, options, reranker, index_dir)
    service.warm_up()
    logger.info("index ready: %s", describe_placements(service.placements()))
    return service
