"""Dense retrieval with FAISS over normalised embeddings (inner product = cosine similarity).

Choices:
- ``flat``: ``IndexFlatIP``, exact search; the reference the approximate indexes are measured against.
- ``hnsw``: ``IndexHNSWFlat`` (M=32, efConstruction=200, efSearch=128): graph search, no training.
- ``ivf``: ``IndexIVFFlat`` with nlist ~ 4*sqrt(N) (at most N/39, so k-means gets 39 points per
  centroid) and nprobe=32. It is trained on the first passages of the corpus, so the build stays a
  single streaming pass; shuffle a sorted corpus first if that sample is unrepresentative.
- The build streams: embeddings arrive in batches and are added as they come (IVF buffers only its
  training sample), so peak memory is the index itself.
- GPU: when the FAISS GPU build is installed and sees a GPU, flat and IVF indexes are copied to all
  GPUs (FAISS has no GPU HNSW); otherwise search runs on CPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import faiss
import numpy as np

from retrieval_server.encoder import Encoder

logger = logging.getLogger(__name__)

INDEX_KINDS = ("flat", "hnsw", "ivf")
INDEX_FILE = "faiss.index"
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 200
HNSW_EF_SEARCH = 128
IVF_NPROBE = 32
IVF_POINTS_PER_CENTROID = 39  # FAISS's minimum for k-means; the training sample is 50 per centroid
IVF_TRAIN_PER_CENTROID = 50


def _new_index(kind: str, dim: int, count: int) -> tuple[faiss.Index, dict]:
    """An empty index of ``kind`` for ``count`` vectors of size ``dim``, and the parameters chosen."""
    if kind == "flat":
        return faiss.IndexFlatIP(dim), {}
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        return index, {"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION, "efSearch": HNSW_EF_SEARCH}
    if kind == "ivf":
        nlist = max(1, min(int(4 * math.sqrt(count)), count // IVF_POINTS_PER_CENTROID))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        return index, {"nlist": nlist, "nprobe": min(nlist, IVF_NPROBE),
                       "train_size": min(count, IVF_TRAIN_PER_CENTROID * nlist)}
    raise ValueError(f"unknown index kind {kind!r}; choose one of {INDEX_KINDS}")


def build_dense_index(batches: Iterable[np.ndarray], kind: str, dim: int, count: int) -> tuple[faiss.Index, dict]:
    """Add embedding batches (each ``[n, dim]`` float32, unit norm, in corpus order) to a new index.

    Returns the index and its parameters (for the manifest).
    """
    index, params = _new_index(kind, dim, count)
    pending: list[np.ndarray] = []  # IVF only: the training sample, held until it is complete
    n_pending = 0
    for batch in batches:
        if index.is_trained:
            index.add(batch)
            continue
        pending.append(batch)
        n_pending += len(batch)
        if n_pending >= params["train_size"]:
            _train_and_flush(index, pending)
            pending = []
    if pending:
        _train_and_flush(index, pending)
    if index.ntotal != count:
        raise ValueError(f"expected {count} embeddings, got {index.ntotal}")
    return index, params


def _train_and_flush(index: faiss.Index, pending: list[np.ndarray]) -> None:
    sample = np.concatenate(pending)  # [n_train, dim]
    logger.info("training IVF quantizer on %d vectors", len(sample))
    index.train(sample)
    index.add(sample)


def flat_batches(index_dir: str | Path, batch_size: int = 16384) -> Iterator[np.ndarray]:
    """The vectors stored in a flat index, in corpus order, as ``[n, dim]`` batches (to rebuild without encoding)."""
    index = faiss.read_index(str(Path(index_dir) / INDEX_FILE))
    if not isinstance(index, faiss.IndexFlat):
        raise ValueError(f"{index_dir} does not hold a flat index")
    for start in range(0, index.ntotal, batch_size):
        yield index.reconstruct_n(start, min(batch_size, index.ntotal - start))


def _to_gpu_if_available(index: faiss.Index, kind: str) -> faiss.Index:
    n_gpus = faiss.get_num_gpus()  # 0 with the CPU build
    if n_gpus == 0 or kind == "hnsw":
        logger.info("FAISS %s index on CPU", kind)
        return index
    logger.info("FAISS %s index copied to %d GPU(s)", kind, n_gpus)
    return faiss.index_cpu_to_all_gpus(index)


class DenseRetriever:
    """Encode queries, search the FAISS index: ``search(queries, k)`` -> (scores, row ids)."""

    def __init__(self, index: faiss.Index, encoder: Encoder):
        self.index = index
        self.encoder = encoder
        self.num_passages = int(index.ntotal)

    @classmethod
    def load(cls, index_dir: str | Path, kind: str, params: dict, encoder: Encoder) -> DenseRetriever:
        index = faiss.read_index(str(Path(index_dir) / INDEX_FILE))
        if kind == "hnsw":
            index.hnsw.efSearch = params["efSearch"]
        elif kind == "ivf":
            index.nprobe = params["nprobe"]
        return cls(_to_gpu_if_available(index, kind), encoder)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` float32 (descending) and row ids ``[B, k]`` int64 (-1 = no hit)."""
        vectors = self.encoder.encode_queries(queries)  # [B, dim]
        scores, ids = self.index.search(vectors, k)
        return scores, ids
