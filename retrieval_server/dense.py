"""Dense retrieval with FAISS over normalised embeddings (inner product = cosine similarity).

Choices:
- ``flat``: ``IndexFlatIP``, exact search; the reference the approximate indexes are measured against.
- ``hnsw``: ``IndexHNSWFlat`` (M=32, efConstruction=200, efSearch=128): graph search, no training.
- ``ivf``: ``IndexIVFFlat`` with nlist ~ 4*sqrt(N) (at most N/39, so k-means gets 39 points per
  centroid) and nprobe=32. It is trained on the first passages of the corpus, so the build stays a
  single streaming pass; shuffle a sorted corpus first if that sample is unrepresentative.
- The build streams: embeddings arrive in batches and are added as they come (IVF buffers only its
  training sample), so peak memory is the index itself.
- Loading memory-maps the vectors (``IO_FLAG_MMAP_IFC``: flat codes, HNSW storage, IVF lists) instead
  of copying them into RAM: a 60 GB flat index costs page cache that the OS can evict, not 60 GB of
  private memory, and several servers on one machine share it. The first search of a cold file
  reads it from disk (the service's warm-up query does that before ``/health`` says ready). A file
  must not be rewritten in place while it is served (a truncated mapping kills the server with
  SIGBUS); ``build_index`` writes a new file and renames it over the old one, which is safe.
- GPU (``gpu_mode``): when the FAISS GPU build is installed and sees GPUs, flat and IVF indexes are
  copied to all visible GPUs, by default sharded (``index_cpu_to_all_gpus`` with ``shard=True``: each
  GPU holds 1/n of the vectors and answers for its rows, so a 60 GB fp32 flat index takes 7.5 GB
  on each of 8 GPUs and leaves them to the trainer), or replicated (each GPU a full copy: faster
  for many small batches, n times the memory). ``gpu_fp16`` stores the vectors on GPU in fp16
  (half the memory; scores round to fp16). FAISS has no GPU HNSW: it stays on CPU.
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


def read_index(path: str | Path) -> faiss.Index:
    """A FAISS index file, its vectors memory-mapped (read-only)."""
    return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)


def index_kind(index: faiss.Index) -> str:
    """``flat``, ``hnsw`` or ``ivf`` for the index types this service searches (exact vectors stored)."""
    if isinstance(index, faiss.IndexFlat):
        return "flat"
    if isinstance(index, faiss.IndexHNSWFlat):
        return "hnsw"
    if isinstance(index, faiss.IndexIVFFlat):
        return "ivf"
    raise ValueError(f"FAISS index type {type(index).__name__} is not served; supported: IndexFlatIP (flat), "
                     "IndexHNSWFlat (hnsw), IndexIVFFlat (ivf)")


def flat_batches(index_path: str | Path, batch_size: int = 16384) -> Iterator[np.ndarray]:
    """The vectors stored in a flat index file, in corpus order, as ``[n, dim]`` batches (to rebuild without
    encoding)."""
    index = read_index(index_path)
    if not isinstance(index, faiss.IndexFlat):
        raise ValueError(f"{index_path} does not hold a flat index")
    for start in range(0, index.ntotal, batch_size):
        yield index.reconstruct_n(start, min(batch_size, index.ntotal - start))


def place_on_gpus(index: faiss.Index, kind: str, mode: str, fp16: bool) -> faiss.Index:
    """The index sharded or replicated over all visible GPUs (``mode``: service.GPU_MODES), or itself where that
    does not apply (CPU build, no GPU, ``off``, HNSW)."""
    n_gpus = faiss.get_num_gpus()  # 0 with the CPU build
    if n_gpus == 0 or mode == "off" or kind == "hnsw":
        logger.info("FAISS %s index on CPU%s", kind, " (FAISS has no GPU HNSW)" if n_gpus and kind == "hnsw" else "")
        return index
    options = faiss.GpuMultipleClonerOptions()
    options.shard = mode == "shard"
    options.useFloat16 = fp16
    logger.info("FAISS %s index %s over %d GPU(s)%s", kind, "sharded" if options.shard else "replicated", n_gpus,
                ", fp16 storage" if fp16 else "")
    return faiss.index_cpu_to_all_gpus(index, co=options)


class DenseRetriever:
    """Encode queries, search the FAISS index: ``search(queries, k)`` -> (scores, row ids)."""

    def __init__(self, index: faiss.Index, encoder: Encoder):
        self.index = index
        self.encoder = encoder
        self.num_passages = int(index.ntotal)

    @classmethod
    def load(cls, index_path: str | Path, kind: str, params: dict, encoder: Encoder, gpu_mode: str = "shard",
             gpu_fp16: bool = False) -> DenseRetriever:
        """The index at ``index_path`` (memory-mapped), with the search parameters of ``params``, placed on GPUs
        by ``gpu_mode`` when there are any."""
        index = read_index(index_path)
        if index_kind(index) != kind:
            raise ValueError(f"{index_path} holds a {index_kind(index)} index, the manifest says {kind}")
        if kind == "hnsw":
            index.hnsw.efSearch = params["efSearch"]
        elif kind == "ivf":
            index.nprobe = params["nprobe"]
        return cls(place_on_gpus(index, kind, gpu_mode, gpu_fp16), encoder)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` float32 (descending) and row ids ``[B, k]`` int64 (-1 = no hit)."""
        vectors = self.encoder.encode_queries(queries)  # [B, dim]
        scores, ids = self.index.search(vectors, k)
        return scores, ids
