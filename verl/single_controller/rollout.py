"""The driver's generator: one ``generate`` call spread over the rollout engines of all actor ranks.

Every actor rank hosts an engine next to its FSDP shard (``verl.workers.actor_rollout``). Ranks
``[g*tp, (g+1)*tp)`` form engine ``g`` (``tp`` = ``rollout.tensor_model_parallel_size``; each rank of
a tensor-parallel engine must see the same prompts), so there are ``dp = world / tp`` engines.
``GroupRollout.generate`` is a drop-in ``Generator`` for an agent loop that runs in the driver:

* **Split, balanced by tokens.** A row may occupy ``len(prompt) + max_tokens`` tokens (its context
  plus the budget it may still sample); rows are dealt longest first to the engine with the least
  work so far (ties: fewer rows, then lower index), so long contexts do not pile up on one engine.
  An engine may get no rows (a late turn with few active rows): its ranks get an empty list and
  return at once. All ranks are called in parallel, one round trip per call.
* **Gathered in order.** Results come back per engine (from its first rank) and are put back at the
  rows' positions, so the caller sees exactly the order (and the n-samples grouping) it asked for.
* **Disjoint seeds.** A call with ``params.seed = s`` uses seeds ``s .. s + rows * n - 1`` on one
  engine (``rollout.base.Generator``); engine g gets ``s + g * rows * n``, so engines never share a
  seed, duplicated prompts (GRPO groups) on different engines sample independently, and with one
  engine the call is exactly the single-engine call.

``generate_on(e, ...)`` (``rollout.base.EnginePool``) calls engine ``e``'s ranks only, with the prompts and
params as given (no split, no seed offset): the asynchronous loop places rows itself and seeds each row
(``row_seeds``), and its calls to different engines run at the same time.

**Versions.** ``version`` is the trainer step whose weights the engines hold (0 = the initial policy; the trainer
sets it after each step, ``weights_update``). Every output carries it per token (``GenerationOutput.versions``).
``weights_update()`` is a context for the sync: it waits for the engine calls in flight to end, holds new ones
back until the sync is done, then sets the new version; engine calls themselves may run concurrently (several
trajectories' rounds on different engines, a pipeline's rollout while the trainer trains).

``take_metrics`` reports, since its previous call: ``perf/rollout_ranks`` (the ranks whose engine generated)
and ``perf/rollout_idle_frac`` (the share of engine time with nothing to generate: 1 - the engines' summed
busy seconds, as each engine's first rank measured them, / (engines x wall seconds)).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

from verl.single_controller.base import WorkerGroup
from verl.workers.engine_host import EngineHost
from verl.workers.rollout.base import GenerationOutput, SamplingParams


def split_by_tokens(costs: list[int], parts: int) -> list[list[int]]:
    """Row indices for each of ``parts`` engines, balancing the summed ``costs`` (greedy, longest first).

    Deterministic; every index appears in exactly one part; indices ascend within a part.
    """
    loads = [0] * parts
    rows_per_part: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        part = min(range(parts), key=lambda p: (loads[p], len(rows_per_part[p]), p))
        rows_per_part[part].append(i)
        loads[part] += costs[i]
    return [sorted(rows) for rows in rows_per_part]


class GroupRollout:
    """``Generator`` over the engine calls (``EngineHost``) of a worker group's ranks (see the module docstring): the
    engines' typed handle, as ``roles.py``'s proxies are the training roles'."""

    def __init__(self, group: WorkerGroup, tensor_parallel_size: int):
        if group.world_size % tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size} does not divide the "
                             f"world size {group.world_size}")
        self.group = group
        self.tp = tensor_parallel_size
        self.engines = group.world_size // tensor_parallel_size
        self.num_engines = self.engines
        self._ranks_used: set[int] = set()
        self._lock = threading.Lock()
        self._window_start = time.perf_counter()
        self.version = 0
        self.can_step = bool(group.execute_ranks(EngineHost.can_step, [0])[0])  # vLLM engines batch continuously
        self._calls = threading.Condition()  # guards _running / _updating (engine calls vs weight updates)
        self._running = 0
        self._updating = False

    @contextlib.contextmanager
    def _engine_call(self):
        """Held during one engine call: waits while weights are being updated; yields the engines' version."""
        with self._calls:
            self._calls.wait_for(lambda: not self._updating)
            self._running += 1
            version = self.version
        try:
            yield version
        finally:
            with self._calls:
                self._running -= 1
                self._calls.notify_all()

    @contextlib.contextmanager
    def weights_update(self, version: int):
        """Around a weight sync: no engine call runs inside; afterwards the engines hold ``version``."""
        with self._calls:
            self._calls.wait_for(lambda: not self._updating)
            self._updating = True
            self._calls.wait_for(lambda: self._running == 0)
        try:
            yield
            self.version = version
        finally:
            with self._calls:
                self._updating = False
                self._calls.notify_all()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Continue each prompt on the engines; ``len(prompts) * params.n`` outputs, grouped by prompt."""
        costs = [len(p) + params.max_tokens for p in prompts]
        rows_per_engine = split_by_tokens(costs, self.engines)
        seeds_per_call = len(prompts) * params.n
        args_per_rank = []
        for rank in range(self.group.world_size):
            engine = rank // self.tp
            seed = None if params.seed is None else params.seed + engine * seeds_per_call
            args_per_rank.append(([prompts[i] for i in rows_per_engine[engine]],
                                  dataclasses.replace(params, seed=seed)))
        with self._engine_call() as version:
            results = self.group.execute_each(EngineHost.generate, args_per_rank)
        n = params.n
        outputs: list[GenerationOutput | None] = [None] * len(prompts) * n
        for engine, rows in enumerate(rows_per_engine):
            engine_outputs = results[engine * self.tp]
            if len(engine_outputs) != len(rows) * n:
                raise RuntimeError(f"engine {engine} returned {len(engine_outputs)} outputs for {len(rows)} "
                                   f"prompts x n={n}")
            _tag(engine_outputs, version)
            for k, row in enumerate(rows):
                outputs[row * n:(row + 1) * n] = engine_outputs[k * n:(k + 1) * n]
            if rows:
                self._ranks_used.update(range(engine * self.tp, (engine + 1) * self.tp))
        return outputs

    def generate_on(self, engine: int, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Continue ``prompts`` on engine ``engine`` alone (every rank of a tensor-parallel engine gets the call)."""
        if not 0 <= engine < self.engines:
            raise IndexError(f"engine {engine} of {self.engines}")
        ranks = list(range(engine * self.tp, (engine + 1) * self.tp))
        with self._engine_call() as version:
            outputs = _tag(self.group.execute_ranks(EngineHost.generate, ranks, prompts, params)[0], version)
        if len(outputs) != len(prompts) * params.n:
            raise RuntimeError(f"engine {engine} returned {len(outputs)} outputs for {len(prompts)} prompts "
                               f"x n={params.n}")
        if prompts:
            with self._lock:
                self._ranks_used.update(ranks)
        return outputs

    def _ranks(self, engine: int) -> list[int]:
        if not 0 <= engine < self.engines:
            raise IndexError(f"engine {engine} of {self.engines}")
        return list(range(engine * self.tp, (engine + 1) * self.tp))

    def step_on(self, engine: int, new: list, max_steps: int) -> tuple[int, list]:
        """Continuous batching on engine ``engine`` (``EnginePool.step_on``); outputs tagged with the version."""
        ranks = self._ranks(engine)
        with self._engine_call() as version:
            finished = self.group.execute_ranks(EngineHost.engine_step, ranks, new, max_steps)[0]
        _tag([out for _, out in finished], version)
        with self._lock:
            self._ranks_used.update(ranks)
        return version, finished

    def abort_on(self, engine: int, request_ids: list[str]) -> None:
        self.group.execute_ranks(EngineHost.engine_abort, self._ranks(engine), request_ids)

    def take_metrics(self) -> dict[str, float]:
        """``perf/rollout_ranks`` and ``perf/rollout_idle_frac`` since the previous call (then reset)."""
        busy = self.group.execute_all(EngineHost.take_rollout_busy_s)  # per rank; an engine's first rank speaks for it
        wall = time.perf_counter() - self._window_start
        engine_busy = sum(busy[e * self.tp] for e in range(self.engines))
        with self._lock:
            metrics = {"perf/rollout_ranks": float(len(self._ranks_used)),
                       "perf/rollout_idle_frac": max(0.0, 1.0 - engine_busy / max(self.engines * wall, 1e-9))}
            self._ranks_used.clear()
            self._window_start = time.perf_counter()
        return metrics


def _tag(outputs: list[GenerationOutput], version: int) -> list[GenerationOutput]:
    for out in outputs:
        out.versions = [version] * len(out.token_ids)
    return outputs
