"""Dense index files: FAISS over normalised embeddings (inner product = cosine similarity), built and read.

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
  SIGBUS); ``build.py`` writes a new file and renames it over the old one, which is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import faiss
import numpy as np

from retrieval_server.index.kinds import check_search_params, kind_of, new_index, train_projection
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
