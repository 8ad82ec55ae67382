"""The FAISS index kinds the service builds and serves, their construction, search parameters and sizes.

Every kind ranks by inner product over unit vectors (cosine). ``N`` rows, dimension ``d``:

==========  =====================================  =========================================  ==================
kind        FAISS type                             search parameter (``index_params``)        bytes per vector
==========  =====================================  =========================================  ==================
flat        IndexFlatIP                            none: exact, the reference                 4d
fp16        IndexScalarQuantizer(QT_fp16)          none: exhaustive scan of 16-bit codes      2d
sq8         IndexScalarQuantizer(QT_8bit)          none: exhaustive scan of 8-bit codes       d
hnsw        IndexHNSWFlat (M=32)                   ``efSearch``                               4d + 8M + 16
hnswsq8     IndexHNSWSQ(QT_8bit, M=12)             ``efSearch``                               d + 8M + 16
hnswsq6     IndexHNSWSQ(QT_6bit, M=12)             ``efSearch``                               6d/8 + 8M + 16
pcahnswsq8  projection to p = 2d/3, IndexHNSWSQ    ``efSearch``                               p + 8M + 16
            (QT_8bit, M=12) over the projections
ivf         IndexIVFFlat                           ``nprobe`` of ``nlist`` lists              4d + 8 (ids)
ivfsq8      IndexIVFScalarQuantizer(QT_8bit)       ``nprobe``                                 d + 8
ivfpq       IndexIVFPQ (m = d/8 codes, 8 bits)     ``nprobe``                                 m + 8
opq         OPQ rotation, then IVF-PQ              ``nprobe``                                 m + 8
==========  =====================================  =========================================  ==================

- HNSW's ``8M + 16``: 2M level-0 links of 4 bytes, an 8-byte offset, a 4-byte level, and on average 4 bytes of
  upper-level links (a vector reaches level 1 with probability 1/M and has M links there).
- ``hnswsq8`` walks the same kind of graph over 8-bit codes (a quarter of the vectors' bytes) with fewer links
  (M=12): 0.32 of flat's memory at d=384, 0.29 at d=768. The codes order near ties imperfectly (SQ8 alone tops
  out near recall@3 0.985), so it is meant to be ``refine``d (``--refine fp32``): the graph finds ``k * k_factor``
  candidates and the stored vectors order them exactly. Unlike a scan of the codes, the re-ranking reads only
  those few stored vectors per query, so the refine store can stay in its memory-mapped file. ``hnswsq6``: the same
  over 6-bit codes, 0.26 of flat at d=384 (measured against hnswsq8 at 2M vectors in docs/results.md).
- ``pcahnswsq8`` walks the same graph over 8-bit codes of the vectors projected onto their ``p = 2d/3`` (rounded
  down to a multiple of 8) main directions: 0.24 of flat's memory at d=384, and each hop reads p bytes, not d. The
  projection is the top eigenvectors of the training rows' *uncentred* second moment ``X^T X / n`` with no bias
  term: inner products of projections approximate the inner products themselves (a centred PCA, FAISS's
  ``PCAMatrix``, would add a ``-mean . x`` term that reorders passages for every query). Sentence encodings keep most
  of their energy in fewer directions than their size (all-MiniLM-L6-v2: docs/results.md; the manifest records
  ``pca_energy``, the share kept on the training rows); what the projection loses reorders near ties, so this kind
  too is meant to be ``refine``d from the full vectors (``--refine fp32``).
- ``refine`` (any approximate kind): ``IndexRefine`` keeps a second, exact or nearly exact copy of the vectors
  (``fp32``: +4d bytes, ``fp16``: +2d, ``sq8``: +d) and re-ranks the base index's ``k * k_factor`` best
  candidates with it, so a coarse code (PQ) finds the candidates and the stored vectors order them.
- ``nlist`` (IVF kinds) is about ``4 sqrt(N)``, at most ``N / 39`` (FAISS's k-means minimum of 39 points per
  centroid). Training samples, taken from the first rows of the stream (so the build stays one pass; shuffle a
  sorted corpus first): IVF kinds 50 rows per list, at most ``MAX_TRAIN``; PQ 39 rows per centroid of a
  sub-quantizer (256 centroids: 8-bit codes; ``pq_nbits`` uses fewer bits for a tiny corpus); SQ8 learns its
  value ranges from ``SQ_TRAIN`` rows. k-means runs ``KMEANS_ITERS`` iterations (FAISS's default is 25; the
  centroids move little after 10, and training is the build's largest cost at millions of rows on a CPU).
- Every kind here loads memory-mapped (``IO_FLAG_MMAP_IFC``: flat and SQ codes, PQ codes, IVF lists, the refine
  store, HNSW's vectors; HNSW's links are read into memory); the tests check that the file is mapped.
- FAISS is imported by the functions that use it, not by this module: a BM25 build imports ``INDEX_KINDS`` and
  ``REFINES`` (its arguments' choices) on a machine without faiss, which is an optional dependency (setup.py's
  ``cpu`` / ``gpu`` extras). ``require_faiss`` is the check a dense build or service makes first.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import faiss

INDEX_KINDS = ("flat", "fp16", "sq8", "hnsw", "hnswsq8", "hnswsq6", "pcahnswsq8", "ivf", "ivfsq8", "ivfpq", "opq")
EXACT_KINDS = ("flat",)
REFINES = ("none", "fp32", "fp16", "sq8")
HNSW_M = 32
HNSW_SQ_M = 12  # hnswsq8/6: fewer links, so that codes and graph stay under a third of flat at d=384
HNSW_EF_CONSTRUCTION = 200
HNSW_EF_SEARCH = 128
IVF_NPROBE = 32
IVF_POINTS_PER_CENTROID = 39  # FAISS's minimum for k-means
IVF_TRAIN_PER_CENTROID = 50
MAX_TRAIN = 262_144
SQ_TRAIN = 65_536
KMEANS_ITERS = 10
OPQ_MIN_ROWS = 256
K_FACTOR = 4  # refine: candidates re-ranked per result wanted
_IVF_KINDS = ("ivf", "ivfsq8", "ivfpq", "opq")
HNSW_KINDS = ("hnsw", "hnswsq8", "hnswsq6", "pcahnswsq8")
_HNSW_SQ = {"hnswsq8": "QT_8bit", "hnswsq6": "QT_6bit", "pcahnswsq8": "QT_8bit"}  # faiss.ScalarQuantizer.<name>
FAISS_INSTALL = "pip install faiss-cpu (or the project's extra, pip install -e '.[cpu]'; '.[gpu]' for faiss-gpu-cu12)"


class FaissMissing(ImportError):
    """A dense index was asked for and faiss is not installed (the tools' ``main`` turn it into exit status 2)."""


def require_faiss(what: str = "a dense index"):
    """The ``faiss`` module; ``FaissMissing`` naming it and how to install it where it is not installed."""
    try:
        import faiss
    except ImportError as e:
        raise FaissMissing(f"{what} needs FAISS, and `import faiss` fails here ({e}): install it with "
                           f"{FAISS_INSTALL}. A BM25 index (--retriever bm25) needs no FAISS") from None
    return faiss


def nlist_for(count: int) -> int:
    return max(1, min(int(4 * math.sqrt(count)), count // IVF_POINTS_PER_CENTROID))


def pca_dim(dim: int) -> int:
    """Size of ``pcahnswsq8``'s projection: 2/3 of ``dim``, rounded down to a multiple of 8 (384 -> 256)."""
    return max(8, 2 * dim // 3 // 8 * 8)


def pq_m(dim: int) -> int:
    """Sub-quantizers of the PQ kinds: about d/8 (one byte each), a divisor of d."""
    m = max(1, dim // 8)
    while dim % m:
        m -= 1
    return m


def pq_nbits(count: int) -> int:
    """Bits per PQ code: 8 (256 centroids per sub-quantizer), fewer for a corpus too small to train 256 with at
    least 39 rows each."""
    return max(1, min(8, int(math.log2(max(count, 1) / IVF_POINTS_PER_CENTROID)) if count >= 78 else 1))


def bytes_per_vector(kind: str, dim: int, refine: str = "none", hnsw_m: int | None = None) -> float:
    """Memory per stored vector of ``kind`` (codes, list ids, graph links, refine store), without per-index
    constants (centroids, codebooks); ``hnsw_m``: an HNSW kind's links per node if not its default."""
    links = 8 * (hnsw_m or (HNSW_M if kind == "hnsw" else HNSW_SQ_M)) + 16
    base = {"flat": 4 * dim, "fp16": 2 * dim, "sq8": dim, "hnsw": 4 * dim + links,
            "hnswsq8": dim + links, "hnswsq6": math.ceil(6 * dim / 8) + links, "pcahnswsq8": pca_dim(dim) + links,
            "ivf": 4 * dim + 8,
            "ivfsq8": dim + 8, "ivfpq": pq_m(dim) + 8, "opq": pq_m(dim) + 8}[kind]
    return base + {"none": 0, "fp32": 4 * dim, "fp16": 2 * dim, "sq8": dim}[refine]


def resident_bytes_per_vector(kind: str, dim: int, refine: str = "none") -> float:
    """The memory per vector a search of ``kind`` keeps in use: all of ``bytes_per_vector`` but a refine store, which
    is memory-mapped and read ``k * k_factor`` rows a query (disk, and evictable page cache, not resident
    memory). Scans and IVF lists, graphs and their codes are read everywhere, so they count in full."""
    return bytes_per_vector(kind, dim)


def new_index(kind: str, dim: int, count: int, refine: str = "none", nlist: int | None = None,
              hnsw_m: int | None = None) -> tuple[faiss.Index, dict]:
    """An empty index of ``kind`` for ``count`` vectors of size ``dim`` and its parameters (for the manifest):
    search parameters, ``train_size`` (rows to buffer before training; 0 = no training). ``nlist`` (IVF kinds) and
    ``hnsw_m`` (HNSW kinds: links per node) replace the kind's default where given."""
    import faiss

    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown index kind {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    if refine not in REFINES:
        raise ValueError(f"unknown refine store {refine!r}; choose one of {', '.join(REFINES)}")
    if refine != "none" and kind in EXACT_KINDS:
        raise ValueError("refine re-ranks an approximate index's candidates; flat is exact already")
    if kind == "opq" and count < OPQ_MIN_ROWS:
        raise ValueError(f"opq trains its rotation with 256 centroids per sub-quantizer: it needs at least "
                         f"{OPQ_MIN_ROWS} passages, the corpus has {count}; use ivfpq")
    ip = faiss.METRIC_INNER_PRODUCT  # every kind ranks by inner product
    params: dict = {}
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind in ("fp16", "sq8"):
        index = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16 if kind == "fp16"
                                           else faiss.ScalarQuantizer.QT_8bit, ip)
    elif kind in HNSW_KINDS:
        m = hnsw_m or (HNSW_M if kind == "hnsw" else HNSW_SQ_M)
        graph_dim = pca_dim(dim) if kind == "pcahnswsq8" else dim
        index = faiss.IndexHNSWFlat(dim, m, ip) if kind == "hnsw" else faiss.IndexHNSWSQ(
            graph_dim, getattr(faiss.ScalarQuantizer, _HNSW_SQ[kind]), m, ip)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        params = {"M": m, "efConstruction": HNSW_EF_CONSTRUCTION, "efSearch": HNSW_EF_SEARCH}
        if kind == "pcahnswsq8":  # the projection is learnt from the training rows (train_projection)
            index = faiss.IndexPreTransform(faiss.LinearTransform(dim, graph_dim, False), index)
            params["pca_dim"] = graph_dim
    else:
        nlist = nlist or nlist_for(count)
        m, bits = pq_m(dim), pq_nbits(count)
        spec = {"ivf": f"IVF{nlist},Flat", "ivfsq8": f"IVF{nlist},SQ8", "ivfpq": f"IVF{nlist},PQ{m}x{bits}",
                "opq": f"OPQ{m},IVF{nlist},PQ{m}x{bits}"}[kind]
        index = faiss.index_factory(dim, spec, ip)
        ivf = faiss.extract_index_ivf(index)
        ivf.cp.niter = KMEANS_ITERS
        params = {"nlist": nlist, "nprobe": min(nlist, IVF_NPROBE)}
        if kind in ("ivfpq", "opq"):
            # polysemous training reorders the centroids for Hamming-distance filtering, which is not used here; it
            # is most of the PQ training time
            faiss.downcast_index(ivf).do_polysemous_training = False
            params.update(pq_m=m, pq_bits=bits)
    if refine != "none":
        store = faiss.IndexFlatIP(dim) if refine == "fp32" else faiss.IndexScalarQuantizer(
            dim, faiss.ScalarQuantizer.QT_fp16 if refine == "fp16" else faiss.ScalarQuantizer.QT_8bit, ip)
        index = faiss.IndexRefine(index, store)
        params.update(refine=refine, k_factor=K_FACTOR)
    params["train_size"] = min(count, _train_size(kind, refine, params))
    return index, params


def _train_size(kind: str, refine: str, params: dict) -> int:
    need = 0
    if kind in _IVF_KINDS:
        need = min(MAX_TRAIN, IVF_TRAIN_PER_CENTROID * params["nlist"])
        if kind in ("ivfpq", "opq"):
            need = max(need, IVF_POINTS_PER_CENTROID * 2 ** params["pq_bits"])
    if kind in ("sq8", "ivfsq8", *_HNSW_SQ) or refine == "sq8":
        need = max(need, SQ_TRAIN)
    return need


def kind_of(index: faiss.Index) -> tuple[str, str]:
    """(kind, refine store) of a loaded index; ``ValueError`` naming what is served for any other type."""
    import faiss

    index = faiss.downcast_index(index)
    refine = "none"
    if isinstance(index, faiss.IndexRefine):
        store = faiss.downcast_index(index.refine_index)
        refine = "fp32" if isinstance(store, faiss.IndexFlat) else _sq_kind(store)
        index = faiss.downcast_index(index.base_index)
    if isinstance(index, faiss.IndexPreTransform):
        inner = faiss.downcast_index(index.index)
        rotation = faiss.downcast_VectorTransform(index.chain.at(0))  # read back as its LinearTransform base
        if isinstance(inner, faiss.IndexIVFPQ) and index.chain.size() == 1 and isinstance(rotation,
                                                                                          faiss.LinearTransform):
            return "opq", refine
        if isinstance(inner, faiss.IndexHNSWSQ) and _sq_kind(faiss.downcast_index(inner.storage)) == "sq8" and \
                index.chain.size() == 1 and type(rotation) is faiss.LinearTransform and not rotation.have_bias:
            return "pcahnswsq8", refine
    elif isinstance(index, faiss.IndexFlat):
        return "flat", refine
    elif isinstance(index, faiss.IndexHNSWFlat):
        return "hnsw", refine
    elif isinstance(index, faiss.IndexHNSWSQ) and _sq_kind(faiss.downcast_index(index.storage)) in ("sq8", "sq6"):
        return "hnsw" + _sq_kind(faiss.downcast_index(index.storage)), refine
    elif isinstance(index, faiss.IndexIVFFlat):
        return "ivf", refine
    elif isinstance(index, faiss.IndexIVFScalarQuantizer):
        return "ivfsq8", refine
    elif isinstance(index, faiss.IndexIVFPQ):
        return "ivfpq", refine
    elif isinstance(index, faiss.IndexScalarQuantizer) and _sq_kind(index) in ("fp16", "sq8"):
        return _sq_kind(index), refine
    raise ValueError(f"FAISS index type {type(index).__name__} is not served; supported kinds: "
                     f"{', '.join(INDEX_KINDS)} (optionally refined)")


def _sq_kind(index: faiss.Index) -> str:
    import faiss

    qtype = index.sq.qtype
    return {faiss.ScalarQuantizer.QT_fp16: "fp16", faiss.ScalarQuantizer.QT_8bit: "sq8",
            faiss.ScalarQuantizer.QT_6bit: "sq6"}.get(qtype, f"SQ{qtype}")


SEARCH_PARAMS = ("nprobe", "efSearch", "k_factor")


def search_params(params: dict) -> dict:
    """The subset of ``params`` that changes what a search returns (what a recall figure is measured at)."""
    return {k: params[k] for k in SEARCH_PARAMS if k in params}


def check_search_params(kind: str, refine: str, count: int, search: dict) -> None:
    """``ValueError`` naming the setting unless each of ``search`` (``{"nprobe": .., "efSearch": .., "k_factor":
    ..}``, values given by hand) is a parameter of ``kind`` / ``refine`` within its range, for ``count`` vectors."""
    for name, value in search.items():
        if name == "nprobe" and kind in _IVF_KINDS:
            if not 1 <= value <= nlist_for(count):
                raise ValueError(f"nprobe {value}: give 1 to nlist = {nlist_for(count)} ({kind}, {count} vectors)")
        elif name == "efSearch" and kind in HNSW_KINDS:
            if value < 1:
                raise ValueError(f"efSearch {value}: give at least 1")
        elif name == "k_factor" and refine != "none":
            if value < 1:
                raise ValueError(f"k_factor {value}: give at least 1 (candidates re-ranked per result wanted)")
        elif name in SEARCH_PARAMS:
            owner = {"nprobe": f"the IVF kinds ({', '.join(_IVF_KINDS)})",
                     "efSearch": f"the HNSW kinds ({', '.join(HNSW_KINDS)})",
                     "k_factor": "a refined index (refine fp32, fp16 or sq8)"}[name]
            raise ValueError(f"{name} is a search parameter of {owner}, not of {kind} (refine {refine})")
        else:
            raise ValueError(f"unknown search parameter {name!r}; choose from {', '.join(SEARCH_PARAMS)}")


def apply_search_params(index: faiss.Index, params: dict) -> None:
    """Set ``nprobe`` / ``efSearch`` / ``k_factor`` of ``params`` on ``index`` (those that apply)."""
    import faiss

    index = faiss.downcast_index(index)
    if "k_factor" in params:
        index.k_factor = float(params["k_factor"])
    if "nprobe" in params:
        faiss.extract_index_ivf(index).nprobe = int(params["nprobe"])
    if "efSearch" in params:
        graph_of(index).hnsw.efSearch = int(params["efSearch"])


def graph_of(index: faiss.Index) -> faiss.Index:
    """The HNSW index inside ``index`` (under a refine store and a projection, where there are)."""
    import faiss

    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexRefine):
        index = faiss.downcast_index(index.base_index)
    if isinstance(index, faiss.IndexPreTransform):
        index = faiss.downcast_index(index.index)
    return index


def train_projection(index: faiss.Index, sample: np.ndarray) -> float | None:
    """Learn ``pcahnswsq8``'s projection from ``sample`` ``[n, d]`` where ``index`` has one not yet learnt: its rows
    are the top ``p`` eigenvectors of the uncentred second moment ``sample^T sample / n`` ``[d, d]``, no bias.
    Returns the share of the sample's energy (sum of squares) the projection keeps, None if there was nothing to
    learn."""
    import faiss

    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexRefine):
        index = faiss.downcast_index(index.base_index)
    if not isinstance(index, faiss.IndexPreTransform):
        return None
    projection = faiss.downcast_VectorTransform(index.chain.at(0))
    if projection.is_trained or type(projection) is not faiss.LinearTransform:
        return None
    sample = sample.astype(np.float64)
    moments, directions = np.linalg.eigh(sample.T @ sample / len(sample))  # ascending eigenvalues, [d], [d, d]
    top = directions[:, ::-1][:, :projection.d_out]  # [d, p]
    faiss.copy_array_to_vector(np.ascontiguousarray(top.T, dtype=np.float32).ravel(), projection.A)  # [p, d]
    projection.is_trained = True
    return float(moments[::-1][:projection.d_out].sum() / moments.sum())
