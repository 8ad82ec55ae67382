"""Deduplicated, cached search: each distinct query of a batch is searched once, repeats are remembered.

GRPO samples each prompt n times (n=5 in Search-R1), so one retrieval request often holds the same
query several times, and training epochs, validation and concurrent requests repeat queries across
requests. Encoding is the cost of a dense search, so:

- Inside one ``search`` call (one request, or one coalesced batch of concurrent requests with the same
  ``k``), identical query strings are encoded and searched once and the result is copied to each.
- Across calls, an LRU cache keyed by ``(query, k)`` answers repeats without searching. It stores row
  ids and scores, not passages (a few dozen bytes per entry; passages are read from the corpus for
  every answer), and is keyed by the exact string: two strings that differ only in case or spaces
  are different queries (some encoders are cased).
- A cached answer is what the same query got when it was searched, so answers are the same with and
  without the cache up to float rounding: an encoder's rounding can depend on what a query is
  batched with (padding length, matrix shapes), in the last bits of a score, with or without cache.
- ``capacity`` 0 turns the cache off; deduplication is always on (it never costs more than it saves).
- Used from one thread (the coalescer's worker); ``stats()`` may be called from any thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

# queries, k -> scores [B, k], row ids [B, k]
SearchFn = Callable[[list[str], int], tuple[np.ndarray, np.ndarray]]


@dataclass
class CacheStats:
    """Counters since the service started (``GET /stats``)."""

    queries: int = 0  # queries asked for, repeats included
    duplicates: int = 0  # queries answered by an identical query of the same batch
    hits: int = 0  # distinct queries of a batch answered from the cache
    misses: int = 0  # distinct queries of a batch that were searched
    entries: int = 0  # entries held now
    capacity: int = 0


class CachedSearch:
    """``search(queries, k)`` with the signature of ``search_fn``, deduplicating and caching its calls."""

    def __init__(self, search_fn: SearchFn, capacity: int):
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0 (0 = off), got {capacity}")
        self.search_fn = search_fn
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()  # oldest first
        self._stats = CacheStats(capacity=capacity)
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` and row ids ``[B, k]``, as ``search_fn`` would return them."""
        if not queries:
            return np.zeros((0, k), dtype=np.float32), np.zeros((0, k), dtype=np.int64)
        distinct = list(dict.fromkeys(queries))  # first occurrence order
        found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for query in distinct:
            entry = self._entries.get((query, k))
            if entry is not None:
                self._entries.move_to_end((query, k))
                found[query] = entry
        missing = [q for q in distinct if q not in found]
        if missing:
            scores, rows = self.search_fn(missing, k)  # [M, k], [M, k]
            for i, query in enumerate(missing):
                found[query] = (scores[i].copy(), rows[i].copy())  # copies: a view would keep the whole batch alive
            self._store(missing, k, found)
        with self._lock:
            stats = self._stats
            stats.queries += len(queries)
            stats.duplicates += len(queries) - len(distinct)
            stats.hits += len(distinct) - len(missing)
            stats.misses += len(missing)
            stats.entries = len(self._entries)
        scores_per_query = [found[q][0] for q in queries]
        rows_per_query = [found[q][1] for q in queries]
        return np.stack(scores_per_query), np.stack(rows_per_query)  # [B, k], [B, k]

    def _store(self, queries: list[str], k: int, found: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        if self.capacity == 0:
            return
        for query in queries[-self.capacity:]:
            self._entries[(query, k)] = found[query]
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(**asdict(self._stats))
