"""Coalescing concurrent search requests into one batched call on a worker thread.

Choices:
- All encode + search work runs on one dedicated worker thread, never on the event loop, so the
  server keeps accepting and parsing requests while a batch is being searched. One thread, because
  torch, FAISS and numba already parallelise a batch internally; two batches at once would only
  compete for the same cores.
- No waiting timer: requests that arrive while the worker is busy queue up and are merged into the
  next call (up to ``max_batch`` queries), so a lone request is served at once and a burst of
  concurrent requests is served in one encoder/index call (larger matrix products are faster per query).
- Merged requests are grouped by ``k`` and each group is searched as one batch: a request's answer
  never depends on what it was merged with (which of several tied passages make the top k, and what
  an HNSW search finds, depend on k). Clients normally all send the same ``k``, so a burst is still
  one call.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from retrieval_server.search.service import BackendError, Hit

logger = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], list[list[Hit]]]


@dataclass
class _Job:
    queries: list[str]
    k: int
    future: asyncio.Future


class Coalescer:
    """``await submit(queries, k)`` -> hits per query; concurrent submissions share one ``search_fn`` call."""

    def __init__(self, search_fn: SearchFn, max_batch: int):
        self.search_fn = search_fn
        self.max_batch = max_batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        self._pending: deque[_Job] = deque()
        self._wakeup = asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Hits for each of ``queries`` (top ``k``), searched together with whatever else is queued."""
        job = _Job(queries, k, asyncio.get_running_loop().create_future())
        self._pending.append(job)
        self._wakeup.set()
        return await job.future

    def _take_jobs(self) -> list[_Job]:
        """Queued jobs, oldest first, up to ``max_batch`` queries (always at least one job)."""
        jobs = [self._pending.popleft()]
        total = len(jobs[0].queries)
        while self._pending and total + len(self._pending[0].queries) <= self.max_batch:
            job = self._pending.popleft()
            total += len(job.queries)
            jobs.append(job)
        return jobs

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                jobs = self._take_jobs()
                groups: dict[int, list[_Job]] = {}  # k -> its jobs, in arrival order
                for job in jobs:
                    groups.setdefault(job.k, []).append(job)
                try:
                    hits_per_group = await loop.run_in_executor(self._executor, self._search_groups, groups)
                except Exception as exc:  # delivered to every waiting request; the worker keeps serving
                    if isinstance(exc, BackendError):  # an engine's refusal or outage: its message says it all
                        logger.warning("search of a batch of %d requests failed: %s", len(jobs), exc)
                    else:
                        logger.exception("search of a batch of %d requests failed", len(jobs))
                    for job in jobs:
                        if not job.future.done():
                            job.future.set_exception(exc)
                    continue
                if len(jobs) > 1:
                    logger.debug("coalesced %d requests into %d search call(s)", len(jobs), len(groups))
                for group, hits in zip(groups.values(), hits_per_group, strict=True):
                    start = 0
                    for job in group:
                        if not job.future.done():  # the client may have gone away
                            job.future.set_result(hits[start:start + len(job.queries)])
                        start += len(job.queries)

    def _search_groups(self, groups: dict[int, list[_Job]]) -> list[list[list[Hit]]]:
        """On the worker thread: one ``search_fn`` call per distinct k, over all queries of that k."""
        return [self.search_fn([q for job in group for q in job.queries], k) for k, group in groups.items()]

    async def close(self) -> None:
        self._worker.cancel()
        try:
            await self._worker
        except asyncio.CancelledError:
            pass
        for job in self._pending:
            job.future.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
