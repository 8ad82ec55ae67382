"""Results inside a coalesced burst equal the results of the same query sent alone, over the real service.

Many concurrent clients send requests of mixed batch sizes and topk at once; while the worker thread searches
one batch, the others queue and are merged into the next search call (``batcher.Coalescer``). Each query's
answer (ids, order, scores) must be the one it gets when it is the only query of the only request (dense scores:
to float32 rounding, since a matrix product's rounding depends on the batch shape).
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from retrieval_server.launcher import ServerProcess
from tests.retrieval_server.retrieval_test_corpus import PASSAGES

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

PATTERNS = ("what is {t} known for", "{t} history")
QUERIES = [pattern.format(t=title) for _, title, _ in PASSAGES for pattern in PATTERNS]  # 40 distinct queries
TOPKS = (1, 3, 10)
BATCH_SIZES = (1, 2, 3, 8, 17, 40)
SCORE_TOLERANCE = 1e-6  # dense: float32 matrix products round differently for different batch shapes (~1e-8)


def _answer(result_row: list[dict]) -> list[tuple[str, float]]:
    return [(hit["document"]["id"], hit["score"]) for hit in result_row]


def _same(burst: list[tuple[str, float]], alone: list[tuple[str, float]], exact: bool) -> bool:
    """Same ids in the same order; the same scores (BM25: exactly; dense: to ``SCORE_TOLERANCE``)."""
    if [pid for pid, _ in burst] != [pid for pid, _ in alone]:
        return False
    return all(a == b if exact else abs(a - b) <= SCORE_TOLERANCE for (_, a), (_, b) in zip(burst, alone, strict=True))


async def _post(http: httpx.AsyncClient, url: str, queries: list[str], k: int) -> list[list[tuple[str, float]]]:
    response = await http.post(url + "/retrieve", json={"queries": queries, "topk": k, "return_scores": True})
    assert response.status_code == 200, response.text
    return [_answer(row) for row in response.json()["result"]]


async def _alone(url: str) -> dict[tuple[str, int], list[tuple[str, float]]]:
    """Every (query, k) as the single query of a request, one request at a time."""
    async with httpx.AsyncClient(timeout=60) as http:
        return {(q, k): (await _post(http, url, [q], k))[0] for q in QUERIES for k in TOPKS}


async def _burst(url: str, clients: int, seed: int) -> list[tuple[list[str], int, list]]:
    """``clients`` concurrent clients, each sending 2 requests of random batch size and k back to back."""
    rng = random.Random(seed)
    jobs = [[(rng.sample(QUERIES, rng.choice(BATCH_SIZES)), rng.choice(TOPKS)) for _ in range(2)]
            for _ in range(clients)]

    async def one_client(requests: list[tuple[list[str], int]]) -> list[tuple[list[str], int, list]]:
        async with httpx.AsyncClient(timeout=120) as http:
            return [(queries, k, await _post(http, url, queries, k)) for queries, k in requests]

    per_client = await asyncio.gather(*(one_client(requests) for requests in jobs))
    return [answer for answers in per_client for answer in answers]


@pytest.mark.parametrize("index", ["bm25_index", "flat_index"])
def test_burst_answers_equal_answers_alone(index, corpus_path, request):
    """Guards against coalescing changing what a query gets: hits of another request's queries or k, a different
    order of tied passages, or different scores because the encoder ran on a larger padded batch."""
    # no answer cache: every query of the burst must be searched, merged with the others
    args = ["--threads", "1", "--max-topk", "10", "--max-queries", "128", "--cache-size", "0"]
    with ServerProcess(request.getfixturevalue(index), corpus_path, args) as server:
        server.wait_ready()
        alone = asyncio.run(_alone(server.url))
        burst = asyncio.run(_burst(server.url, clients=32, seed=0))
    assert len(burst) == 64
    checked = 0
    for queries, k, answers in burst:
        for query, answer in zip(queries, answers, strict=True):
            assert _same(answer, alone[(query, k)], exact=index == "bm25_index"), (query, k, answer, alone[(query, k)])
            checked += 1
    assert checked > 500  # the burst held that many queries (about 750 for this seed)
