"""Dense retrieval with FAISS over normalised embeddings (inner product = cosine similarity).

Choices:
- The index kinds (exact ``flat``; scalar-quantised ``fp16``, ``sq8``; graph ``hnsw``; inverted-file ``ivf``,
  ``ivfsq8``, ``ivfpq``, ``opq``; any approximate one optionally ``refine``d), their sizes and search parameters
  are in ``kinds.py``; the recall each approximate index was measured at, in ``tuning.py``.
- The build streams: embeddings arrive in batches and are added as they come (kinds that learn buffer only
  their training sample, taken from the first rows), so peak memory is the index itself.
  ``build_measured_index`` also keeps the exact top-k of held-out queries in that pass and records the recall.
- Loading memory-maps the vectors (``IO_FLAG_MMAP_IFC``: flat and quantised codes, PQ codes, IVF lists, the
  refine store, HNSW's stored vectors; every kind loads this way, none falls back to a copy; HNSW's graph links,
  8M bytes a vector, are read into memory) instead
  of copying them into RAM: a 60 GB flat index costs page cache that the OS can evict, not 60 GB of
  private memory, and several servers on one machine share it. The first search of a cold file
  reads it from disk (the service's warm-up query does that before ``/health`` says ready). A file
  must not be rewritten in place while it is served (a truncated mapping kills the server with
  SIGBUS); ``build_index`` writes a new file and renames it over the old one, which is safe.
- GPU (``gpu_mode``): only when asked (``--faiss-gpu shard|replicate``; the default, ``off``, searches on the
  CPU), flat and IVF indexes are copied to all visible GPUs, sharded (``index_cpu_to_all_gpus`` with
  ``shard=True``: each GPU holds 1/n of the vectors and answers for its rows, so a 60 GB fp32 flat index takes
  7.5 GB on each of 8 GPUs and leaves them to the trainer), or replicated (each GPU a full copy: faster
  for many small batches, n times the memory). ``gpu_fp16`` stores the vectors on GPU in fp16
  (half the memory; scores round to fp16). ``gpu_budget_gb`` (``--faiss-gpu-memory-gb``) is the most of each
  GPU the index may take, the rest being left to training: an index that needs more is refused with the ways
  out, never placed. FAISS has no GPU HNSW: it stays on CPU, as does
  any kind FAISS cannot clone to GPU (``IndexRefine``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import faiss
import numpy as np

from retrieval_server.devices import Placement, measured
from retrieval_server.index.encoder import Encoder
from retrieval_server.index.kinds import (  # noqa: F401  (HNSW_EF_SEARCH, INDEX_KINDS: re-exported)
    HNSW_EF_SEARCH,
    HNSW_KINDS,
    INDEX_KINDS,
    apply_search_params,
    bytes_per_vector,
    check_search_params,
    kind_of,
    new_index,
    train_projection,
)
from retrieval_server.index.tuning import (
    RECALL_KS,
    StreamingTopK,
    exact_recall,
    record_recall,
    stream_truth,
    tune_search_params,
)

logger = logging.getLogger(__name__)


def build_dense_index(batches: Iterable[np.ndarray] | np.ndarray, kind: str, dim: int, count: int,
                      refine: str = "none", nlist: int | None = None,
                      hnsw_m: int | None = None) -> tuple[faiss.Index, dict]:
    """Add embedding batches (each ``[n, dim]`` float32, unit norm, in corpus order; or one ``[count, dim]`` array)
    to a new index of ``kind`` (``kinds.INDEX_KINDS``; ``refine``: ``kinds.REFINES``). Kinds that learn
    (IVF, PQ, SQ8) buffer the first ``train_size`` rows, train on them, then add everything.

    ``nlist`` / ``hnsw_m``: an IVF kind's lists / an HNSW kind's links per node, where not the kind's default.
    Returns the index and its parameters (for the manifest), at the kind's default search parameters.
    """
    if isinstance(batches, np.ndarray):
        batches = [batches]
    index, params = new_index(kind, dim, count, refine, nlist, hnsw_m)
    pending: list[np.ndarray] = []  # IVF only: the training sample, held until it is complete
    n_pending = 0
    for batch in batches:
        if index.is_trained and not pending:
            index.add(batch)
            continue
        pending.append(batch)
        n_pending += len(batch)
        if n_pending >= params["train_size"]:
            _train_and_flush(index, pending, params)
            pending = []
    if pending:
        _train_and_flush(index, pending, params)
    if index.ntotal != count:
        raise ValueError(f"expected {count} embeddings, got {index.ntotal}")
    return index, params


def build_measured_index(batches: Iterable[np.ndarray] | np.ndarray, kind: str, dim: int, count: int,
                         queries: np.ndarray | None, source: str, refine: str = "none",
                         target_recall: float | None = None, recall_k: int = 3, search: dict | None = None
                         ) -> tuple[faiss.Index, dict]:
    """``build_dense_index`` that also measures recall, in the same pass: the exact top-10 of the held-out
    ``queries`` ``[q, dim]`` (described by ``source``) is kept while the vectors stream through. The search
    parameters are ``search`` where given (e.g. ``{"nprobe": 64}``, ``kinds.check_search_params``), else tuned
    to reach recall@``recall_k`` >= ``target_recall`` where given, else the kind's defaults; ``params["recall"]``
    holds recall@3 and @10 at them (``tuning.record_recall``; flat: exact, ``queries`` unused and may be None).

    Returns the index (its search parameters applied) and its parameters (for the manifest).
    """
    search = search or {}
    if search and target_recall is not None:
        raise ValueError(f"give search parameters ({', '.join(search)}) or a target recall to tune them to, not both")
    check_search_params(kind, refine, count, search)
    if kind == "flat":
        index, params = build_dense_index(batches, kind, dim, count, refine)
        return index, {**params, "recall": exact_recall()}
    top = StreamingTopK(queries, max(RECALL_KS))
    index, params = build_dense_index(stream_truth([batches] if isinstance(batches, np.ndarray) else batches, top),
                                      kind, dim, count, refine)
    truth = top.result()[1]  # [q, max(RECALL_KS)]
    if search:
        params = {**params, **search}
    elif target_recall is not None:
        params = tune_search_params(index, kind, params, queries, truth, target_recall, recall_k)
    params = record_recall(index, params, queries, truth, source)
    logger.info("%s index (refine %s): recall@3 %.4f, recall@10 %.4f at %s on %s", kind, refine,
                params["recall"]["at_3"], params["recall"]["at_10"], params["recall"]["params"], source)
    return index, params


def _train_and_flush(index: faiss.Index, pending: list[np.ndarray], params: dict) -> None:
    sample = np.concatenate(pending)  # [n_train, dim]
    logger.info("training the index on %d vectors", len(sample))
    energy = train_projection(index, sample)  # pcahnswsq8: the projection first, then the codes of projections
    if energy is not None:
        params["pca_energy"] = round(energy, 5)
    index.train(sample)
    index.add(sample)


def read_index(path: str | Path) -> faiss.Index:
    """A FAISS index file, its vectors memory-mapped (read-only)."""
    return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)


def index_kind(index: faiss.Index) -> str:
    """The kind (``kinds.INDEX_KINDS``) of a loaded index; ``ValueError`` for a type this service does not
    serve."""
    return kind_of(index)[0]


def flat_batches(index_path: str | Path, batch_size: int = 16384) -> Iterator[np.ndarray]:
    """The vectors stored in a flat index file, in corpus order, as ``[n, dim]`` batches (to rebuild without
    encoding)."""
    index = read_index(index_path)
    if not isinstance(index, faiss.IndexFlat):
        raise ValueError(f"{index_path} does not hold a flat index")
    for start in range(0, index.ntotal, batch_size):
        yield index.reconstruct_n(start, min(batch_size, index.ntotal - start))


def gpu_bytes_per_gpu(kind: str, dim: int, rows: int, n_gpus: int, mode: str, fp16: bool) -> float:
    """Bytes of stored vectors (codes and list ids) each GPU holds for ``rows`` vectors of ``kind`` placed by
    ``mode`` (``shard``: 1/n of the rows each; ``replicate``: all of them), ``fp16``: flat / IVF-flat vectors
    stored in 16 bits. FAISS's own scratch memory per GPU comes on top."""
    half = fp16 and kind in ("flat", "ivf")
    per_vector = bytes_per_vector("fp16", dim) + (8 if kind == "ivf" else 0) if half else bytes_per_vector(kind, dim)
    share = math.ceil(rows / n_gpus) if mode == "shard" else rows
    return per_vector * share


def check_gpu_budget(kind: str, dim: int, rows: int, n_gpus: int, mode: str, fp16: bool,
                     budget_gb: float | None) -> None:
    """``ValueError`` naming the need, the budget and the ways out when the index would take more than
    ``budget_gb`` (GiB) of one GPU's memory (what training does not need); no check without a budget, GPUs, or
    where the index stays on CPU (``off``, HNSW)."""
    if budget_gb is None or n_gpus == 0 or mode == "off" or kind in HNSW_KINDS:
        return
    need = gpu_bytes_per_gpu(kind, dim, rows, n_gpus, mode, fp16) / 2**30
    if need > budget_gb:
        ways = ["--faiss-gpu-fp16"] if kind in ("flat", "ivf") and not fp16 else []
        ways += ["--faiss-gpu shard"] if mode == "replicate" and n_gpus > 1 else []
        ways += ["a compressed index kind (sq8, ivfsq8, ivfpq, opq)", "more shards (build_index --shards)",
                 "--faiss-gpu off (search on CPU)"]
        raise ValueError(f"the {kind} index of {rows:,} vectors x {dim} needs {need:.2f} GiB on each of {n_gpus} "
                         f"GPU(s) ({mode}{', fp16' if fp16 else ''}), over --faiss-gpu-memory-gb {budget_gb:g}; "
                         f"use {', or '.join(ways)}")


def place_on_gpus(index: faiss.Index, kind: str, mode: str, fp16: bool, budget_gb: float | None = None
                  ) -> faiss.Index:
    """The index sharded or replicated over all visible GPUs (``mode``: service.GPU_MODES), or itself where that
    does not apply (CPU build, no GPU, ``off``, HNSW, a kind FAISS cannot clone to GPU). ``ValueError`` if it would
    take more than ``budget_gb`` of a GPU (``check_gpu_budget``)."""
    n_gpus = faiss.get_num_gpus()  # 0 with the CPU build
    if n_gpus == 0 or mode == "off" or kind in HNSW_KINDS:
        return index
    if not isinstance(faiss.downcast_index(index), faiss.IndexRefine):  # a refined index stays on CPU (below)
        check_gpu_budget(kind, index.d, index.ntotal, n_gpus, mode, fp16, budget_gb)
    options = faiss.GpuMultipleClonerOptions()
    options.shard = mode == "shard"
    options.useFloat16 = fp16
    try:
        return faiss.index_cpu_to_all_gpus(index, co=options)
    except RuntimeError as e:  # a kind FAISS cannot clone to GPU (e.g. IndexRefine) stays on CPU
        logger.warning("FAISS %s index stays on CPU: %s", kind, str(e).splitlines()[0])
        return index


class DenseRetriever:
    """Encode queries, search the FAISS index: ``search(queries, k)`` -> (scores, row ids)."""

    def __init__(self, index: faiss.Index, encoder: Encoder):
        self.index = index
        self.encoder = encoder
        self.num_passages = int(index.ntotal)
        self.placements: list[Placement] = []  # where the index and the encoder run: set by service.load_retriever

    @classmethod
    def load(cls, index_path: str | Path, kind: str, params: dict, encoder: Encoder, placement: Placement,
             gpu_mode: str = "off", gpu_fp16: bool = False, gpu_budget_gb: float | None = None) -> DenseRetriever:
        """The index at ``index_path`` (memory-mapped), with the search parameters of ``params``, on the GPUs where
        ``placement`` (``service.plan_devices``) puts it, spread by ``gpu_mode``, within ``gpu_budget_gb`` of each.
        ``placement`` gets the device memory it took, or the CPU where FAISS could not clone the kind to a GPU."""
        index = read_index(index_path)
        found, refine = kind_of(index)
        if (found, refine) != (kind, params.get("refine", "none")):
            raise ValueError(f"{index_path} holds a {found} index (refine {refine}), the manifest says {kind} "
                             f"(refine {params.get('refine', 'none')})")
        apply_search_params(index, params)
        with measured(placement):
            placed = place_on_gpus(index, kind, gpu_mode if placement.device != "cpu" else "off", gpu_fp16,
                                   gpu_budget_gb)
        if placed is index and placement.device != "cpu":
            placement.device, placement.how, placement.device_bytes = "cpu", "faiss; cannot be cloned to a GPU", 0
        return cls(placed, encoder)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` float32 (descending) and row ids ``[B, k]`` int64 (-1 = no hit)."""
        vectors = self.encoder.encode_queries(queries)  # [B, dim]
        scores, ids = self.index.search(vectors, k)
        return scores, ids
