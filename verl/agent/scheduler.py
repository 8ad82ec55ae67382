"""Driver-side scheduling of the agent loop (``verl.agent.loop``), in which every trajectory runs as its own
coroutine.

A trajectory's loop awaits two kinds of service: a generation (``EngineScheduler.generate``, or
``Lockstep.submit``) and its environment's reply (the action format's ``Service``s; for example a retrieval).
Two schedules serve them:

* ``Lockstep`` (``rollout.mode: sync``): nothing is sent until every live trajectory waits; then all
  waiting requests of the first kind in priority order that has any go out as ONE call, rows in
  trajectory order. With the environment's services before generation this is exactly the turn-by-turn loop:
  one engine call per turn for all active rows, one call per service and turn for all rows that use it.
* ``EngineScheduler`` (``rollout.mode: async``): no barrier. A request goes at once to an engine of the
  ``EnginePool``: the one that served the trajectory's previous turn (its prefix cache holds the
  context) unless that engine's pending work exceeds the least-loaded engine's by more than the
  request's own cost, else the least-loaded one (work = context + budget tokens of its queued and
  running requests). Each engine runs rounds: an idle engine takes everything queued for it (or, with
  nothing queued, the queue of the busiest engine) as one ``generate_on`` call; requests that arrive
  meanwhile wait for its next round. Each request keeps its own budget (``max_tokens``) and seeds
  (``row_seeds`` from (seed, trajectory, turn, chunk)), so what a row samples does not depend on which
  rows shared its round.
  With ``chunk_tokens > 0`` a round generates at most that many tokens per request; a request not
  finished by then (no eos or stop string, budget left) re-enters the queue with its tokens appended to
  its context, so a short turn never waits for a long one for more than one chunk (engines with a
  prefix cache re-read the context from it). A stop string that spans two chunks is found on the
  joined text (``truncate_at_stop``) and the tokens after it are dropped, as the engine would have
  stopped there.
  Engines that batch continuously (``EnginePool.can_step``: vLLM) get no rounds: each engine's serving task
  adds whatever is queued to the engine's running batch and steps it until a request finishes (at most
  ``max_steps`` steps per call, so a new request joins within that many steps); finished requests go back to
  their trajectories at once. A request's tokens record the policy version of the call that added it (weights
  change only between batches there: ``rollout.partial`` is for the round engines).

Blocking calls (engine calls, HTTP) run in the caller's thread pool through ``run_blocking``, so the
event loop keeps serving the other trajectories while they run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verl.workers.rollout.base import EnginePool, GenerationOutput, SamplingParams
from verl.workers.rollout.hf_rollout import truncate_at_stop

RunBlocking = Callable[..., Awaitable[Any]]  # run_blocking(fn, *args) -> awaitable of fn(*args), in a thread


def request_seed(base: int, key: int, turn: int, chunk: int) -> int:
    """The seed of one chunk of one trajectory's turn: a function of these four numbers only."""
    return int(np.random.SeedSequence([base % 2**63, key, turn, chunk]).generate_state(2, np.uint64)[0] % 2**62)


class Lockstep:
    """Requests wait until every live trajectory waits; then one kind's requests go out as one call.

    ``handlers``: (kind, handler) in priority order; ``handler(items)`` receives the waiting items of
    that kind in trajectory order and returns one result per item.
    """

    def __init__(self, live: int, handlers: list[tuple[str, Callable[[list[Any]], Awaitable[list[Any]]]]]):
        self.live = live
        self.handlers = handlers
        self.waiting: dict[str, dict[int, tuple[Any, asyncio.Future]]] = {kind: {} for kind, _ in handlers}
        self.dispatching = False

    async def submit(self, kind: str, key: int, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.waiting[kind][key] = (item, future)
        self._maybe_dispatch()
        return await future

    def leave(self) -> None:
        """A trajectory ended (or failed): it will wait no more."""
        self.live -= 1
        self._maybe_dispatch()

    def _maybe_dispatch(self) -> None:
        if not self.dispatching and self.live > 0 and sum(map(len, self.waiting.values())) == self.live:
            self.dispatching = True
            asyncio.get_running_loop().create_task(self._dispatch())

    async def _dispatch(self) -> None:
        kind, handler = next((k, h) for k, h in self.handlers if self.waiting[k])
        batch = sorted(self.waiting[kind].items())
        self.waiting[kind] = {}
        try:
            results = await handler([item for _, (item, _) in batch])
        except BaseException as err:  # noqa: BLE001 - delivered to the waiting trajectories
            for _, (_, future) in batch:
                if not future.done():
                    future.set_exception(err)
            if isinstance(err, asyncio.CancelledError):
                raise
        else:
            for (_, (_, future)), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self.dispatching = False
        self._maybe_dispatch()


@dataclass
class _Request:
    key: int
    turn: int
    prompt: list[int]  # the context: the trajectory so far plus this turn's tokens of earlier chunks
    remaining: int  # tokens this turn may still sample
    future: asyncio.Future
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    chunks: int = 0
    queued_cost: int = 0  # the cost added to its engine's load when it was queued (continuous engines)
    request_id: str = ""
    first_version: int | None = None

    @property
    def cost(self) -> int:
        return len(self.prompt) + self.remaining


@dataclass
class SchedulerStats:
    engine_calls: int = 0
    rows: int = 0  # rows over all calls (a request continued over chunks counts once per chunk)
    chunks_continued: int = 0


class EngineScheduler:
    """The asynchronous schedule of the module docstring over ``pool``'s engines."""

    def __init__(self, pool: EnginePool, params: SamplingParams, run_blocking: RunBlocking, chunk_tokens: int,
                 decode: Callable[[list[int]], str], seed: int, max_steps: int = 16):
        self.pool = pool
        self.continuous = bool(getattr(pool, "can_step", False))
        self.max_steps = max_steps
        self.inflight: list[dict[str, _Request]] = [{} for _ in range(pool.num_engines)]
        self._ids = itertools.count()
        self._prefix = f"r{id(self):x}"
        self.params = params
        self.run_blocking = run_blocking
        self.chunk_tokens = chunk_tokens
        self.decode = decode
        self.seed = seed
        engines = pool.num_engines
        self.queues: list[list[_Request]] = [[] for _ in range(engines)]
        self.load = [0] * engines  # cost of queued + running requests
        self.running = [False] * engines
        self.last_engine: dict[int, int] = {}
        self.stats = SchedulerStats()

    async def generate(self, key: int, turn: int, prompt: list[int], max_tokens: int) -> GenerationOutput:
        """This turn's continuation of trajectory ``key`` (at most ``max_tokens`` tokens)."""
        request = _Request(key, turn, list(prompt), max_tokens, asyncio.get_running_loop().create_future())
        self._enqueue(request)
        return await request.future

    def _enqueue(self, request: _Request) -> None:
        least = min(range(len(self.load)), key=lambda e: (self.load[e], e))
        previous = self.last_engine.get(request.key)
        engine = previous if previous is not None and self.load[previous] <= self.load[least] + request.cost \
            else least
        self.queues[engine].append(request)
        request.queued_cost = request.cost
        self.load[engine] += request.cost
        self._kick(engine)

    def _busy_queues(self, engine: int) -> list[int]:
        """Other engines that are running a round and have requests queued behind it."""
        return [e for e in range(len(self.queues)) if e != engine and self.running[e] and self.queues[e]]

    def _kick(self, engine: int) -> None:
        if self.continuous:
            if not self.running[engine] and self.queues[engine]:
                self.running[engine] = True
                asyncio.get_running_loop().create_task(self._serve(engine))
        elif not self.running[engine] and (self.queues[engine] or self._busy_queues(engine)):
            self.running[engine] = True
            asyncio.get_running_loop().create_task(self._round(engine))

    async def _serve(self, engine: int) -> None:
        """Continuous engines: add what is queued, step until something finishes; until nothing is left."""
        inflight = self.inflight[engine]
        try:
            while self.queues[engine] or inflight:
                new, self.queues[engine] = self.queues[engine], []
                items = []
                for request in new:
                    request.request_id = f"{self._prefix}-{next(self._ids)}"
                    inflight[request.request_id] = request
                    items.append((request.request_id, request.prompt, dataclasses.replace(
                        self.params, max_tokens=request.remaining, row_seeds=None,
                        seed=request_seed(self.seed, request.key, request.turn, 0))))
                self.stats.engine_calls += 1
                self.stats.rows += len(items)
                try:
                    version, finished = await self.run_blocking(self.pool.step_on, engine, items, self.max_steps)
                except BaseException as err:  # noqa: BLE001 - every request on this engine fails with it
                    for request in inflight.values():
                        if not request.future.done():
                            request.future.set_exception(err)
                    if isinstance(err, asyncio.CancelledError):
                        raise
                    return
                for request in new:
                    request.first_version = version
                for request_id, out in finished:
                    request = inflight.pop(request_id)
                    self.load[engine] -= request.queued_cost
                    self.last_engine[request.key] = engine
                    out.versions = None if version is None else [request.first_version] * len(out.token_ids)
                    request.future.set_result(out)
                await asyncio.sleep(0)  # let the trajectories just finished queue their next turn first
        finally:
            self.running[engine] = False

    def abort_unfinished(self) -> None:
        """Continuous engines: drop the requests still in their batches (after a failed rollout; blocking)."""
        for engine, inflight in enumerate(self.inflight):
            if inflight:
                self.pool.abort_on(engine, list(inflight))
                inflight.clear()

    def _take(self, engine: int) -> list[_Request]:
        """Everything queued for ``engine``; with nothing queued, the queue of the busy engine with most queued
        work (it would wait for that engine's round to end)."""
        source = engine
        if not self.queues[engine]:
            busy = self._busy_queues(engine)
            if not busy:
                return []
            source = max(busy, key=lambda e: (sum(r.cost for r in self.queues[e]), -e))
        batch, self.queues[source] = self.queues[source], []
        moved = sum(r.cost for r in batch)
        self.load[source] -= moved
        self.load[engine] += moved
        return batch

    async def _round(self, engine: int) -> None:
        batch = self._take(engine)
        taken = sum(r.cost for r in batch)  # before the round changes the requests' contexts and budgets
        try:
            if batch:
                await self._run(engine, batch)
        finally:
            self.load[engine] -= taken
            self.running[engine] = False
        for request in batch:
            if not request.future.done():
                self._enqueue(request)  # not finished: its next chunk
        self._kick(engine)
        for other in range(len(self.queues)):
            self._kick(other)

    async def _run(self, engine: int, batch: list[_Request]) -> None:
        limits = [min(r.remaining, self.chunk_tokens) if self.chunk_tokens > 0 else r.remaining for r in batch]
        params = dataclasses.replace(self.params, max_tokens=max(limits), seed=None, row_seeds=[
            request_seed(self.seed, r.key, r.turn, r.chunks) for r in batch])
        self.stats.engine_calls += 1
        self.stats.rows += len(batch)
        try:
            outputs = await self.run_blocking(self.pool.generate_on, engine, [r.prompt for r in batch], params)
        except BaseException as err:  # noqa: BLE001 - every request of the round fails with it
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(err)
            if isinstance(err, asyncio.CancelledError):
                raise
            return
        for request, limit, out in zip(batch, limits, outputs, strict=True):
            self.last_engine[request.key] = engine
            self._absorb(request, limit, out)

    def _absorb(self, request: _Request, limit: int, out: GenerationOutput) -> None:
        """Add one round's output to ``request``; finish it (set its future) or leave it to continue."""
        ids = out.token_ids[:limit]
        cut = len(out.token_ids) > limit
        request.token_ids += ids
        request.logprobs += (out.logprobs or [0.0] * len(out.token_ids))[:limit]
        request.versions += (out.versions or [0] * len(out.token_ids))[:limit]
        request.remaining -= len(ids)
        request.chunks += 1
        finish, stop_str = ("stop", out.stop_str) if out.finish_reason == "stop" and not cut else ("length", None)
        if finish == "length" and request.chunks > 1:  # a stop string may span the chunks
            kept, reason, found = truncate_at_stop(request.token_ids, [], self.params.stop, self.decode)
            if reason == "stop":
                request.token_ids, request.logprobs = kept, request.logprobs[:len(kept)]
                request.versions = request.versions[:len(kept)]
                finish, stop_str = "stop", found
        if finish == "stop" or request.remaining <= 0:
            request.future.set_result(GenerationOutput(request.token_ids, finish, stop_str,
                                                       request.logprobs if self.params.logprobs else None,
                                                       request.versions))
            return
        request.prompt = request.prompt + ids
        self.stats.chunks_continued += 1


class Coalescer:
    """Requests that arrive within ``max_wait_s`` of the first waiting one (or ``max_batch`` of them) go out as
    one call of ``fn(items) -> results``; at most ``max_inflight`` calls run at once."""

    def __init__(self, fn: Callable[[list[Any]], list[Any]], run_blocking: RunBlocking, max_wait_s: float,
                 max_batch: int, max_inflight: int):
        self.fn = fn
        self.run_blocking = run_blocking
        self.max_wait_s = max_wait_s
        self.max_batch = max_batch
        self.slots = asyncio.Semaphore(max_inflight)
        self.pending: list[tuple[Any, asyncio.Future]] = []
        self.timer: asyncio.Task | None = None
        self.calls = 0
        self.items = 0

    async def submit(self, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((item, future))
        if len(self.pending) >= self.max_batch:
            self._flush()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().create_task(self._flush_later())
        return await future

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.max_wait_s)
        self.timer = None
        self._flush()

    def _flush(self) -> None:
        if self.timer is not None and asyncio.current_task() is not self.timer:
            self.timer.cancel()
            self.timer = None
        while self.pending:
            batch, self.pending = self.pending[:self.max_batch], self.pending[self.max_batch:]
            asyncio.get_running_loop().create_task(self._call(batch))

    async def _call(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        async with self.slots:
            self.calls += 1
            self.items += len(batch)
            try:
                results = await self.run_blocking(self.fn, [item for item, _ in batch])
            except BaseException as err:  # noqa: BLE001 - delivered to the waiting trajectories
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                if isinstance(err, asyncio.CancelledError):
                    raise
                return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
