"""Vectors for index benchmarks above the size we can encode: a mixture fitted to real encodings.

Encoding a passage costs ~3 ms on this machine's 2 cores, so millions of real MiniLM encodings are out of
reach; ``bench_index_scale.py`` encodes what fits (the 100k synthetic-text corpus of ``retrieval_corpus.py``)
and fills the rest with samples of a model fitted to those encodings:

- **Fit**: spherical k-means (``faiss.Kmeans``, ``clusters`` centroids) on the real unit vectors; per cluster, the
  principal directions of its members' residuals (``rank`` of them, with their standard deviations) and one
  isotropic standard deviation for the variance the directions leave over. Clusters with fewer than
  ``rank + 2`` members keep only the isotropic part. The mixture weights are the clusters' shares of the rows.
- **Sample**: a cluster by weight, then ``centroid + components^T (std * z) + iso * z'`` with ``z, z'`` standard
  normal, normalised to unit length like every encoding the service indexes. Seeded: the same seed gives the
  same vectors, batch after batch.
- **Check** (``neighbour_profile``): the queries' best-match scores against real and against sampled vectors of
  the same count, printed side by side by the benchmark, say how close the fit is where it matters to a search
  (how far the nearest neighbours are and how crowded the top of the ranking is).

Shapes: vectors ``[n, dim]`` float32, unit norm; ``Mixture.centroids [K, dim]``, ``components [K, rank, dim]``,
``stds [K, rank]``, ``iso [K]``, ``weights [K]``.
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
