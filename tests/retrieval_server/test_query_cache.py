"""Deduplication and the LRU query cache: each distinct query searched once, repeats answered from the cache,
answers equal to uncached ones, in-process (over the real dense retriever) and through the real service."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from retrieval_server.index.manifest import Manifest
from retrieval_server.launcher import ServerProcess
from retrieval_server.search.query_cache import CachedSearch
from retrieval_server.search.service import ServeOptions, load_retriever

QUERIES = ["river into the Sallow Sea", "glassmakers of Kelbrook", "cheese in limestone caves", "brass telescope",
           "ferryman ballad", "bridge engineer", "comet year", "harbour lighthouse"]


class Recording:
    """The real retriever's search, recording which queries reach it."""

    def __init__(self, retriever) -> None:
        self.retriever = retriever
        self.calls: list[tuple[list[str], int]] = []

    def __call__(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        self.calls.append((list(queries), k))
        return self.retriever.search(queries, k)


@pytest.fixture(scope="module")
def retriever(flat_index):
    return load_retriever(flat_index, Manifest.load(flat_index), ServeOptions(threads=1, encoder_dtype="fp32"))


def _reference(retriever, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Plain loop: each query searched alone, no cache."""
    pairs = [retriever.search([q], k) for q in queries]
    return np.concatenate([s for s, _ in pairs]), np.concatenate([r for _, r in pairs])


def test_repeats_in_a_batch_are_searched_once_and_answered_like_the_uncached_search(retriever):
    """Guards against GRPO's n identical queries per prompt being encoded n times, or the fan-out handing a
    repeat another query's rows."""
    search = Recording(retriever)
    cached = CachedSearch(search, capacity=0)
    batch = [QUERIES[i] for i in (0, 1, 0, 2, 1, 0, 3, 3)]
    scores, rows = cached.search(batch, 4)
    assert search.calls == [([QUERIES[0], QUERIES[1], QUERIES[2], QUERIES[3]], 4)]
    ref_scores, ref_rows = _reference(retriever, batch, 4)
    assert rows.tolist() == ref_rows.tolist()
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-6)
    stats = cached.stats()
    assert (stats.queries, stats.duplicates, stats.misses, stats.hits, stats.entries) == (8, 4, 4, 0, 0)


def test_lru_answers_repeats_across_calls_evicts_the_oldest_and_keys_on_k(retriever):
    """Guards against the cache answering a k=2 request with a k=5 answer (or the reverse), growing without
    bound, evicting the most recently used entry instead of the least, or returning a stale row."""
    search = Recording(retriever)
    cached = CachedSearch(search, capacity=2)
    first = cached.search([QUERIES[0], QUERIES[1]], 3)
    again = cached.search([QUERIES[1], QUERIES[0]], 3)  # both hits; QUERIES[0] is now the most recent
    assert len(search.calls) == 1
    assert again[1].tolist() == first[1][::-1].tolist() and again[0].tolist() == first[0][::-1].tolist()
    cached.search([QUERIES[0]], 2)  # another k: a miss, evicts QUERIES[1] (least recently used)
    assert search.calls[-1] == ([QUERIES[0]], 2)
    cached.search([QUERIES[0], QUERIES[1]], 3)
    assert search.calls[-1] == ([QUERIES[1]], 3)  # QUERIES[0] k=3 survived, QUERIES[1] was evicted
    stats = cached.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.capacity) == (3, 4, 2, 2)


def _grpo_requests(seed: int) -> list[list[str]]:
    """GRPO-like traffic: each request holds each of its prompts' queries 5 times, shuffled; later requests repeat
    earlier queries."""
    rng = random.Random(seed)
    requests = []
    for r in range(6):
        distinct = rng.sample(QUERIES, 3) + [f"question {r} about the Varnel River"]
        batch = [q for q in distinct for _ in range(5)]  # [20]
        rng.shuffle(batch)
        requests.append(batch)
    return requests


def _answers(server: ServerProcess, requests: list[list[str]]) -> list[list[list[tuple[str, float]]]]:
    def one(queries: list[str]):
        result = httpx.post(server.url + "/retrieve", json={"queries": queries, "topk": 4, "return_scores": True},
                            timeout=60).json()["result"]
        return [[(hit["document"]["id"], hit["score"]) for hit in hits] for hits in result]

    with ThreadPoolExecutor(3) as pool:  # concurrent requests are coalesced into shared batches
        return list(pool.map(one, requests))


@pytest.mark.slow  # starts two servers
def test_service_answers_are_the_same_with_and_without_the_cache(flat_index, corpus_path):
    """Guards against the cache or the deduplication changing what a client gets (wrong rows, misrouted repeats
    across coalesced requests), and against /stats counters that do not count what happened."""
    requests = _grpo_requests(0) * 2  # the second round repeats every request
    args = ["--threads", "1", "--max-queries", "20", "--encoder-dtype", "fp32"]
    with ServerProcess(flat_index, corpus_path, [*args, "--cache-size", "0"]) as server:
        server.wait_ready()
        uncached = _answers(server, requests)
        uncached_stats = httpx.get(server.url + "/stats").json()
    with ServerProcess(flat_index, corpus_path, [*args, "--cache-size", "1000"]) as server:
        assert server.wait_ready()["cache_size"] == 1000
        cached = _answers(server, requests)
        stats = httpx.get(server.url + "/stats").json()
    assert [[[doc for doc, _ in hits] for hits in answer] for answer in cached] == \
        [[[doc for doc, _ in hits] for hits in answer] for answer in uncached]
    for a, b in zip(cached, uncached, strict=True):
        np.testing.assert_allclose([[s for _, s in hits] for hits in a], [[s for _, s in hits] for hits in b],
                                   rtol=1e-5, atol=1e-6)
    n_queries = sum(len(r) for r in requests)
    distinct = len({q for r in requests for q in r})
    assert stats["queries"] == uncached_stats["queries"] == n_queries
    assert stats["misses"] == distinct and stats["entries"] == distinct  # each distinct query searched once
    assert stats["hits"] + stats["misses"] + stats["duplicates"] == n_queries
    assert uncached_stats["hits"] == 0 and uncached_stats["entries"] == 0
