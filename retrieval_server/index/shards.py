"""Row-range shards of a dense index: ``OUT/shard-0 ... OUT/shard-{N-1}``, each a complete index directory.

Choices:
- Shard ``i`` holds the rows ``[start, end)`` of the corpus, contiguous and in corpus order; the sizes
  are as equal as possible (the first ``count % N`` shards hold one row more). One shard's vectors fit
  one server; N servers (each with its replicas) serve the corpus, and the client merges their top-k.
- The build stays one streaming pass: ``split_rows`` cuts the ordered stream of embedding batches
  (from the encoder, or from an existing flat index) at the shard boundaries, and each shard's index
  is built and written before the next one's rows are read.
- A shard's manifest is the unsharded manifest with ``count`` = its rows (what its FAISS file holds)
  and ``index_params["shard"] = {"index", "of", "start", "end", "total", "set"}``; corpus checksum and
  bytes stay those of the full corpus, which every shard server reads (it adds ``start`` to its local
  row ids). ``set`` identifies one build (corpus checksum, N, index kind, model, build time), so the
  client refuses shards of two builds, even of the same corpus.
- Dense only: BM25 scores depend on corpus-wide statistics (document frequencies, mean length), so the
  shards of a BM25 index would not rank as the whole index does.
- A sharded build is written into a staging directory and moved into ``OUT`` when complete (``staging.py``);
  the shard manifests already under ``OUT`` are deleted just before, so a shard of an earlier build left beyond
  the new N can never be served with the new ones.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from retrieval_server.index.manifest import INDEX_FILE, MANIFEST_NAME, Manifest

SHARD_DIR = "shard-{}"

# (embedding batches of one shard, its row count) -> (FAISS index, its parameters); dense.build_dense_index
BuildFn = Callable[[Iterable[np.ndarray], int], tuple[object, dict]]


def shard_ranges(count: int, n_shards: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each of ``n_shards`` contiguous row ranges covering ``count`` rows, sizes within 1."""
    if not 1 <= n_shards <= count:
        raise ValueError(f"shards must be between 1 and the number of passages ({count}), got {n_shards}")
    size, extra = divmod(count, n_shards)
    bounds = [0]
    for i in range(n_shards):
        bounds.append(bounds[-1] + size + (i < extra))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def split_rows(batches: Iterable[np.ndarray], ranges: list[tuple[int, int]]) -> Iterator[Iterator[np.ndarray]]:
    """Per range, an iterator over the rows of that range, cut from ``batches`` (``[n, dim]`` each, in row order).

    One pass over ``batches``: each range's iterator must be consumed before the next one is taken.
    """
    stream = iter(batches)
    leftover: np.ndarray | None = None

    def rows_of(n_rows: int) -> Iterator[np.ndarray]:
        nonlocal leftover
        while n_rows > 0:
            batch = leftover if leftover is not None else next(stream, None)
            leftover = None
            if batch is None:
                raise ValueError(f"the embedding stream ended {n_rows} rows before the end of a shard")
            if len(batch) > n_rows:
                batch, leftover = batch[:n_rows], batch[n_rows:]  # [n_rows, dim], rest for the next shard
            n_rows -= len(batch)
            yield batch

    for start, end in ranges:
        yield rows_of(end - start)
    if leftover is not None or next(stream, None) is not None:
        raise ValueError(f"the embedding stream holds more than the {ranges[-1][1]} rows of the shards")


def shard_set_id(manifest: Manifest, n_shards: int) -> str:
    """An id shared by the shards of one build only."""
    key = f"{manifest.corpus_sha256}:{n_shards}:{manifest.index}:{manifest.model}:{time.time_ns()}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def clear_shard_manifests(out: Path) -> None:
    """Delete the manifests of every ``shard-*`` directory under ``out`` (a new set moves in; module docstring)."""
    for path in out.glob(SHARD_DIR.format("*") + "/" + MANIFEST_NAME):
        path.unlink(missing_ok=True)


def write_dense_shards(batches: Iterable[np.ndarray], manifest: Manifest, out: Path, n_shards: int,
                       build: BuildFn) -> list[Manifest]:
    """Split the vectors of ``batches`` (all ``manifest.count`` rows, in corpus order) into ``n_shards`` indexes
    built by ``build``, written to ``out/shard-i`` with their manifests (``manifest`` with the shard's count and
    ``index_params["shard"]``). Returns the shards' manifests."""
    import faiss

    ranges = shard_ranges(manifest.count, n_shards)
    set_id = shard_set_id(manifest, n_shards)
    manifests = []
    for i, ((start, end), rows) in enumerate(zip(ranges, split_rows(batches, ranges), strict=True)):
        shard_dir = out / SHARD_DIR.format(i)
        shard_dir.mkdir(exist_ok=True)
        index, params = build(rows, end - start)
        tmp = shard_dir / (INDEX_FILE + ".tmp")  # renamed over the old file: a server still mapping that one is fine
        faiss.write_index(index, str(tmp))
        os.replace(tmp, shard_dir / INDEX_FILE)
        shard = {"index": i, "of": n_shards, "start": start, "end": end, "total": manifest.count, "set": set_id}
        shard_manifest = replace(manifest, count=end - start, index_file=None, index_bytes=None,
                                 index_params={**manifest.index_params, **params, "shard": shard})
        shard_manifest.save(shard_dir)
        manifests.append(shard_manifest)
    return manifests
