"""Vectors for index benchmarks above the size we can encode: models fitted to real encodings.

Encoding a passage costs ~3 ms on this machine's 2 cores, so millions of real MiniLM encodings are out of
reach; ``bench_index_scale.py`` encodes what fits (the 100k synthetic-text corpus of ``retrieval_corpus.py``)
and fills the rest with samples of a model fitted to those encodings. Two models:

- **local** (the default): a kernel density estimate on the real vectors' own neighbourhoods. A sample picks a
  real vector ``x`` at random and moves it inside the span of its ``neighbours`` nearest real vectors:
  ``x + sum_i w_i (x_i - x)`` with ``w_i ~ N(0, bandwidth^2 / neighbours)``, normalised to unit length. So the
  sampled vectors lie where real passages lie, at the real neighbourhoods' scale, and a larger set is a denser
  version of the real one, as a larger corpus of the same kind is. ``bandwidth`` is calibrated (``calibrate``)
  from the real vectors alone, before any index is built: a sample is as similar to the vector it was drawn from
  as a real vector is to its nearest real neighbour (median cosine), so no sample is a near-copy.
- **mixture** (the first model, kept to reproduce its tables): spherical k-means (``faiss.Kmeans``, ``clusters``
  centroids) on the real unit vectors; per cluster, the principal directions of its members' residuals (``rank``
  of them, with their standard deviations) and one isotropic standard deviation for the rest; a sample is
  ``centroid + components^T (std * z) + iso * z'``, normalised. Its samples are smooth blobs that pass far from the
  real passages (the queries' best score over as many samples is 0.61 against 0.72 over the real vectors), so in a
  set of real and sampled vectors 97% of the queries' true top-3 are the 5% real rows, islands that graph and
  inverted-file indexes reach badly: it measures finding outliers, not searching a larger corpus.
- **Check** (``neighbour_profile``): the queries' best-match scores against real and against sampled vectors of
  the same count, printed side by side by the benchmark, say how close a fit is where it matters to a search
  (how far the nearest neighbours are and how crowded the top of the ranking is).

Shapes: vectors ``[n, dim]`` float32, unit norm; ``neighbours [n_real, k]`` row ids; ``Mixture.centroids [K, dim]``,
``components [K, rank, dim]``, ``stds [K, rank]``, ``iso [K]``, ``weights [K]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import faiss
import numpy as np


@dataclass
class Mixture:
    centroids: np.ndarray  # [K, dim] unit vectors (spherical k-means)
    components: np.ndarray  # [K, rank, dim] principal directions of each cluster's residuals
    stds: np.ndarray  # [K, rank] standard deviation along each direction
    iso: np.ndarray  # [K] isotropic standard deviation of what the directions leave over
    weights: np.ndarray  # [K] share of the rows

    @property
    def dim(self) -> int:
        return self.centroids.shape[1]


def fit_mixture(vectors: np.ndarray, clusters: int = 256, rank: int = 16, seed: int = 0) -> Mixture:
    """The mixture of ``clusters`` low-rank Gaussians fitted to ``vectors`` ``[n, dim]`` (unit norm)."""
    n, dim = vectors.shape
    kmeans = faiss.Kmeans(dim, clusters, niter=20, seed=seed, spherical=True, verbose=False)
    kmeans.train(vectors)
    _, assign = kmeans.index.search(vectors, 1)
    assign = assign[:, 0]
    centroids = kmeans.centroids.astype(np.float32)
    components = np.zeros((clusters, rank, dim), np.float32)
    stds = np.zeros((clusters, rank), np.float32)
    iso = np.zeros(clusters, np.float32)
    counts = np.bincount(assign, minlength=clusters)
    for c in range(clusters):
        members = vectors[assign == c]
        if len(members) == 0:
            continue
        resid = members - members.mean(axis=0)  # [m, dim]
        centroids[c] = members.mean(axis=0)
        total = float((resid ** 2).sum() / max(len(members) - 1, 1))  # trace of the covariance
        if len(members) >= rank + 2:
            _, s, vt = np.linalg.svd(resid, full_matrices=False)
            var = s[:rank] ** 2 / (len(members) - 1)
            components[c], stds[c] = vt[:rank], np.sqrt(var)
            total -= float(var.sum())
            iso[c] = np.sqrt(max(total, 0.0) / (dim - rank))
        else:
            iso[c] = np.sqrt(total / dim)
    return Mixture(centroids, components, stds, iso, (counts / n).astype(np.float64))


def sample_batches(mixture: Mixture, n: int, seed: int = 0, batch: int = 65536) -> Iterator[np.ndarray]:
    """``n`` unit vectors drawn from ``mixture``, as ``[<=batch, dim]`` float32 batches."""
    rng = np.random.default_rng(seed)
    rank = mixture.stds.shape[1]
    for start in range(0, n, batch):
        size = min(batch, n - start)
        which = rng.choice(len(mixture.weights), size=size, p=mixture.weights)  # [b]
        z = rng.standard_normal((size, rank), dtype=np.float32) * mixture.stds[which]  # [b, rank]
        out = mixture.centroids[which] + np.einsum("br,brd->bd", z, mixture.components[which])
        out += rng.standard_normal((size, mixture.dim), dtype=np.float32) * mixture.iso[which, None]
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        yield out.astype(np.float32)


def neighbour_profile(queries: np.ndarray, vectors: np.ndarray, k: int = 10) -> dict[str, float]:
    """Mean best score, mean k-th score and mean gap between them of ``queries`` ``[q, dim]`` over ``vectors``."""
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    scores, _ = index.search(queries, k)  # [q, k]
    return {"top1": float(scores[:, 0].mean()), f"top{k}": float(scores[:, -1].mean()),
            "gap": float((scores[:, 0] - scores[:, -1]).mean())}


def real_neighbours(vectors: np.ndarray, k: int = 10) -> np.ndarray:
    """``[n, k]`` ids of each real vector's ``k`` nearest other real vectors (inner product, exact)."""
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    _, ids = index.search(vectors, k + 1)  # [n, k + 1], usually itself first
    own = np.arange(len(vectors))[:, None]
    keep = ids != own
    keep[keep.sum(axis=1) > k, -1] = False  # itself not found (an exact duplicate came first): drop the last
    return ids[keep].reshape(len(vectors), k)


def sample_local(vectors: np.ndarray, neighbours: np.ndarray, n: int, bandwidth: float, seed: int = 0,
                 batch: int = 16384) -> Iterator[np.ndarray]:
    """``n`` unit vectors of the local model (module docstring), as ``[<=batch, dim]`` float32 batches."""
    rng = np.random.default_rng(seed)
    k = neighbours.shape[1]
    for start in range(0, n, batch):
        size = min(batch, n - start)
        which = rng.integers(0, len(vectors), size=size)  # [b] the real vector each sample moves from
        weights = rng.standard_normal((size, k), dtype=np.float32) * np.float32(bandwidth / np.sqrt(k))  # [b, k]
        base = vectors[which]  # [b, dim]
        out = base + np.einsum("bk,bkd->bd", weights, vectors[neighbours[which]] - base[:, None, :])
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        yield out.astype(np.float32)


def calibrate(vectors: np.ndarray, neighbours: np.ndarray, probes: int = 20000, seed: int = 0) -> dict[str, float]:
    """The bandwidth at which a sample is as close to the real vector it was drawn from as real vectors are to their
    nearest real neighbour (medians of the cosine similarities over ``probes`` samples), found by bisection; with the
    figures it was found from. No query is looked at: the rule says what a new passage is (no nearer to an existing
    one than existing ones are to each other, so never a near-copy), not what makes a benchmark easy."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(vectors), size=min(probes, len(vectors)), replace=False)
    nearest = float(np.median((vectors[rows] * vectors[neighbours[rows, 0]]).sum(axis=1)))

    def closeness(bandwidth: float) -> float:
        sub = vectors[rows]
        k = neighbours.shape[1]
        weights = np.random.default_rng(seed + 1).standard_normal((len(rows), k)).astype(np.float32)
        moved = sub + np.einsum("bk,bkd->bd", weights * np.float32(bandwidth / np.sqrt(k)),
                                vectors[neighbours[rows]] - sub[:, None, :])
        moved /= np.linalg.norm(moved, axis=1, keepdims=True)
        return float(np.median((moved * sub).sum(axis=1)))

    low, high = 0.0, 8.0  # closeness falls as the bandwidth grows
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if closeness(mid) > nearest else (low, mid)
    bandwidth = (low + high) / 2
    return {"bandwidth": bandwidth, "nearest_real_similarity": nearest,
            "sample_source_similarity": closeness(bandwidth)}
