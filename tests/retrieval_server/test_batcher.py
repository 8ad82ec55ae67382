"""The request coalescer: concurrent submissions merged per k, answers routed back to the right request."""

from __future__ import annotations

import asyncio
import threading

import pytest

from retrieval_server.serve.batcher import Coalescer


class RecordingSearch:
    """A search function whose first call blocks until released, so later submissions queue up behind it.

    Hits are derived from the query text: query ``q`` gets ``[({"id": f"{q}#{j}"}, -j) for j < k]``.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        self.calls.append((list(queries), k))
        self.started.set()
        self.release.wait(timeout=30)
        if "boom" in queries:
            raise RuntimeError("index exploded")
        return [[({"id": f"{q}#{j}", "contents": q}, float(-j)) for j in range(k)] for q in queries]


def _ids(hits_per_query):
    return [[doc["id"] for doc, _ in hits] for hits in hits_per_query]


def test_queued_requests_are_merged_per_k_and_routed_back():
    """Guards against requests queued behind a busy worker being searched one by one (no batching), mixed
    across different k, exceeding max_batch, or handed each other's answers."""
    search = RecordingSearch()

    async def scenario():
        coalescer = Coalescer(search, max_batch=4)
        first = asyncio.ensure_future(coalescer.submit(["a"], 1))
        await asyncio.to_thread(search.started.wait, 30)  # the worker is now busy with ["a"]
        later = [asyncio.ensure_future(coalescer.submit(q, k))
                 for q, k in [(["b"], 2), (["c1", "c2"], 2), (["d"], 3), (["e"], 2)]]
        await asyncio.sleep(0)  # let them enqueue
        search.release.set()
        results = await asyncio.gather(first, *later)
        await coalescer.close()
        return results

    results = asyncio.run(scenario())
    assert search.calls == [(["a"], 1), (["b", "c1", "c2"], 2), (["d"], 3), (["e"], 2)]  # b+c1+c2+d = max_batch
    assert _ids(results[0]) == [["a#0"]]
    assert _ids(results[1]) == [["b#0", "b#1"]]
    assert _ids(results[2]) == [["c1#0", "c1#1"], ["c2#0", "c2#1"]]
    assert _ids(results[3]) == [["d#0", "d#1", "d#2"]]
    assert _ids(results[4]) == [["e#0", "e#1"]]


def test_a_failing_search_fails_its_requests_and_the_worker_goes_on():
    """Guards against one failing batch killing the worker task (every later request would hang forever)."""
    search = RecordingSearch()
    search.release.set()

    async def scenario():
        coalescer = Coalescer(search, max_batch=8)
        with pytest.raises(RuntimeError, match="index exploded"):
            await coalescer.submit(["boom"], 1)
        after = await coalescer.submit(["fine"], 1)
        await coalescer.close()
        return after

    assert _ids(asyncio.run(scenario())) == [["fine#0"]]
