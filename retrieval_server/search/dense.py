"""Dense search: queries encoded, then the FAISS index searched, on the CPU or placed on GPUs.

Choices:
- The index is read memory-mapped by ``index/dense.py`` (``read_index``: why) and checked against the manifest's kind
  before it is searched.
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
from pathlib import Path

import faiss
import numpy as np

from retrieval_server.index.dense import read_index
from retrieval_server.index.encoder import Encoder
from retrieval_server.index.kinds import HNSW_KINDS, apply_search_params, bytes_per_vector, kind_of
from retrieval_server.search.devices import Placement, measured

logger = logging.getLogger(__name__)


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
