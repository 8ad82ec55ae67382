"""The multi-turn agent loop: generate a turn, parse it with the action format, let the environment answer, until
every row has answered or run out of turns or budget. It knows no task: what a turn means is the format's
(``verl.agent.format.ActionFormat``; the search task's tags and tool calls, a calculator's, ...).

Every row runs its own turn loop (``_trajectory``, one asyncio task per row): generate until a stop string or eos;
the format parses the turn into an action (``ActionKind``): an executed action gets the environment's answer
inserted (``ActionFormat.act``), a turn with no well-formed action gets the format's feedback, a turn that answered
ends the row. After ``max_turns`` acting turns, one final turn runs in which an action is no longer executed: the
row ends after it whatever it wrote. The rows' requests are served by one of two schedules
(``actor_rollout_ref.rollout.mode``; ``verl.agent.scheduler``):

- ``sync`` (lockstep): each turn is ONE engine call for all active rows, then ONE call per environment service for
  all rows that used it (services first, in the format's order); a row waits for the slowest row of its turn.
- ``async``: no barrier. A row that finished its turn goes to its environment at once while others still generate,
  and back to an engine as soon as its answer is in; each engine batches whatever is pending (``EngineScheduler``:
  least-loaded engine, the previous turn's engine preferred; turns cut into ``rollout.async_chunk_tokens`` chunks);
  a blocking service's items that arrive together share a call (``Coalescer``). Each row samples with its own seeds,
  so its tokens do not depend on which rows shared an engine call; with greedy decoding both schedules give the
  same trajectories up to floating-point differences of batch composition (docs/results.md).

Choices, and where they differ from Search-R1 (whose loop this generalises):

- Token-in/token-out. A row's response is exactly the ids the engine sampled plus the ids of the inserted blocks,
  in order; sampled ids are decoded only to parse the action. (Search-R1 decodes and re-tokenises the whole
  rollout, which can change the tokens the loss is computed on.)
- ``info_mask`` is built while the response grows: 1 = sampled by the policy (trained), 0 = inserted by the
  environment (context only). The trainer's ``loss_mask`` is ``response_mask * info_mask`` (docs/design.md,
  "Masks").
- Lengths mean what they mean in Search-R1 (docs/design.md, "Lengths"): ``max_start_length`` caps the initial prompt
  (its last tokens are kept, counted), ``max_response_length`` is what ONE turn may sample, ``max_obs_length`` one
  inserted block (the format's), ``max_prompt_length`` the context a turn conditions on (prompt + response so far),
  and ``max_trajectory_length`` the whole response (every turn's sampled and inserted tokens). A turn cut at
  ``max_response_length`` before any action is an invalid action: it gets the feedback and the row goes on
  (counted in ``agent/cut/max_response_length``); in the final turn it ends the row with ``MAX_LENGTH``.
- The rolling context is never cut. The engine always continues ``prompt + response so far``, the exact sequence
  the actor later scores; an insertion that would take the context past ``max_prompt_length``, or leave the policy
  no token of trajectory budget, is not appended and ends the row with ``MAX_LENGTH`` (``TurnContext.insert``). A
  prompt longer than ``max_prompt_length`` is an error: the dataset drops such rows.
- Every cut is counted under the key of the budget that made it (``Trajectory.cut_by``, ``agent/cut/<key>``), and a
  budget that costs more than ``LENGTH_WARN_FRAC`` of a call's rows an action or an answer is named in a warning. A
  call for several rows asks for the largest per-row budget and cuts each row's output to its own.
- Forced prefixes (``run(..., turn_prefix=fn)``, evaluation only): before a turn, ``fn`` may insert ids at the start
  of a row's turn (e.g. the first words of a decision) to measure the policy with a behaviour forced; they are
  inserted ids (info_mask 0) and count towards the budget. The trainer never passes one.
- EOS without an answer ends the row: the policy said it is done, and text appended after its EOS would be
  off-distribution.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl.agent.format import ActionFormat, Service, TurnContext
from verl.agent.scheduler import Coalescer, EngineScheduler, Lockstep, RunBlocking
from verl.agent.trajectory import (
    CONTEXT_BUDGET,
    LENGTH_WARN_FRAC,
    TRAJECTORY_BUDGET,
    TURN_BUDGET,
    ActionKind,
    AgentResult,
    StopReason,
    Trajectory,
    length_losses,
)
from verl.protocol import Batch
from verl.utils.seq import pack_trajectories
from verl.utils.tokenizer import pad_token_id
from verl.workers.rollout.base import GenerationOutput, Generator, SamplingParams, as_pool

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from verl.config import DataConfig, RolloutConfig

logger = logging.getLogger(__name__)

# (row index, turn index, the row's trajectory so far) -> ids inserted at the start of that row's turn ([] = none)
TurnPrefixFn = Callable[[int, int, Trajectory], list[int]]


def run_coroutine(make: Callable[[], Awaitable[Any]]) -> Any:
    """``asyncio.run(make())``; in a helper thread when this thread already runs an event loop (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(make())
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name="agent-loop")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass
class _IO:
    """What a row's loop awaits, as the schedule provides it (``Calls`` for the format)."""

    generate: Callable[[int, int, list[int], int], Awaitable[GenerationOutput]]  # (row, turn, context, budget)
    call: Callable[[str, int, Any], Awaitable[Any]]  # (service, row, item) -> the answer
    batch: Callable[[str, list[Any]], Awaitable[list[Any]]]  # (service, items) -> answers, now
    leave: Callable[[], None]  # a row ended
    stats: Callable[[], dict[str, float]]
    abort: Callable[[], None] = lambda: None  # after a failed run, once no engine call runs: drop unfinished requests


class _Calls:
    """The ``Calls`` a format sees: the run's ``_IO``, once it exists (services are declared before it is made)."""

    io: _IO | None = None

    def call(self, name: str, row: int, item: Any) -> Awaitable[Any]:
        return self.io.call(name, row, item)

    def batch(self, name: str, items: list[Any]) -> Awaitable[list[Any]]:
        return self.io.batch(name, items)


def _answer(service: Service, items: list[Any], run_blocking: RunBlocking) -> Awaitable[list[Any]]:
    """One call of ``service`` for ``items``: in the thread pool when it blocks."""
    return run_blocking(service.fn, items) if service.blocking else service.fn(items)


class AgentLoop:
    """Runs the multi-turn loop of an action format for a batch of prompts with any ``Generator`` (one engine, or the
    engines of all ranks). ``data``: the lengths (``data.*``); ``rollout``: the schedule (``mode``,
    ``async_chunk_tokens``) and ``multi_turn.max_assistant_turns``, which replaces ``max_turns + 1`` when set;
    ``max_turns``: the task's acting turns (one final turn follows)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, engine: Generator, action_format: ActionFormat,
                 data: DataConfig, rollout: RolloutConfig, max_turns: int) -> None:
        self.tokenizer = tokenizer
        self.engine = engine
        self.format = action_format
        self.data = data
        self.rollout = rollout
        assistant_turns = rollout.multi_turn.max_assistant_turns
        self.max_turns = max_turns if assistant_turns is None else assistant_turns - 1
        self._warned_budgets: set[str] = set()  # length budgets already named in a warning

    def run(self, prompt_ids: list[list[int]], params: SamplingParams,
            turn_prefix: TurnPrefixFn | None = None) -> AgentResult:
        """Roll out every prompt until it answers or runs out of turns or budget.

        ``params`` sets the sampling (temperature, top-p, ...); the loop sets ``max_tokens`` and
        ``stop`` per turn, and needs ``params.n == 1`` (the trainer repeats rows for n samples).
        ``turn_prefix`` (evaluation only) inserts forced ids at the start of a row's turn (module docstring).
        """
        if params.n != 1:
            raise ValueError(f"the agent loop samples one trajectory per row; got n={params.n} "
                             "(repeat the rows instead)")
        rows = [self._start(list(p), i) for i, p in enumerate(prompt_ids)]
        start = time.perf_counter()
        stats = run_coroutine(lambda: self._run_all(rows, dataclasses.replace(params, stop=list(self.format.stop)),
                                                    turn_prefix))
        truncated = sum(r.prompt_truncated for r in rows)
        if truncated:
            logger.warning("%d of %d prompts were cut to data.max_start_length=%d tokens", truncated, len(rows),
                           self.data.max_start_length)
        self.format.finish(rows)
        self._warn_length_losses(rows)
        return AgentResult(rows, wall_s=time.perf_counter() - start, schedule=stats,
                           format_metrics=self.format.metrics(rows))

    async def _run_all(self, rows: list[Trajectory], params: SamplingParams,
                       turn_prefix: TurnPrefixFn | None) -> dict[str, float]:
        """Every row's loop as its own task, over the schedule of ``rollout.mode``; the schedule's counters."""
        loop = asyncio.get_running_loop()
        pool = as_pool(self.engine)
        calls = _Calls()
        services = self.format.services(calls)
        workers = pool.num_engines + sum(s.max_inflight for s in services if s.blocking) + 1
        failed = True
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout") as executor:
            def run_blocking(fn, *args):
                return loop.run_in_executor(executor, fn, *args)

            io = self._lockstep_io(rows, params, services, run_blocking) if self.rollout.mode == "sync" else \
                self._async_io(pool, params, services, run_blocking)
            calls.io = io
            tasks = [asyncio.ensure_future(self._trajectory(i, row, io, calls, params.logprobs, turn_prefix))
                     for i, row in enumerate(rows)]
            try:
                await asyncio.gather(*tasks)
                failed = False
            except BaseException:  # the first failure is raised (as the lockstep loop raised it); the rest stop
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            finally:
                if failed:
                    executor.shutdown(wait=True)  # the engine calls still running end first
                    io.abort()
        return io.stats()

    def _lockstep_io(self, rows: list[Trajectory], params: SamplingParams, services: list[Service],
                     run_blocking: RunBlocking) -> _IO:
        """``mode: sync``: one engine call per turn for all active rows (``max_tokens`` = the largest remaining
        budget, ``params.seed`` for every turn), one call per service and turn for all rows that use it, services
        first."""

        async def generate(requests: list[tuple[list[int], int]]) -> list[GenerationOutput]:
            turn_params = dataclasses.replace(params, max_tokens=max(budget for _, budget in requests))
            outputs = await run_blocking(self.engine.generate, [context for context, _ in requests], turn_params)
            if len(outputs) != len(requests):
                raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(requests)} prompts")
            return outputs

        by_name = {s.name: s for s in services}
        handlers = [(s.name, lambda items, s=s: _answer(s, items, run_blocking)) for s in services]
        lockstep = Lockstep(len(rows), [*handlers, ("generate", generate)])
        return _IO(generate=lambda key, turn, context, budget: lockstep.submit("generate", key, (context, budget)),
                   call=lambda name, key, item: lockstep.submit(name, key, item),
                   batch=lambda name, items: _answer(by_name[name], items, run_blocking), leave=lockstep.leave,
                   stats=lambda: {})

    def _async_io(self, pool, params: SamplingParams, services: list[Service], run_blocking: RunBlocking) -> _IO:
        """``mode: async``: the engine scheduler, and a coalescer per blocking service (``verl.agent.scheduler``)."""
        seed = params.seed if params.seed is not None else random.getrandbits(62)
        scheduler = EngineScheduler(pool, params, run_blocking, self.rollout.async_chunk_tokens, self._decode, seed)
        by_name = {s.name: s for s in services}
        coalescers = {s.name: Coalescer(s.fn, run_blocking, s.coalesce_s, s.max_batch, s.max_inflight)
                      for s in services if s.blocking}

        def stats() -> dict[str, float]:
            counters = {"perf/engine_calls": float(scheduler.stats.engine_calls),
                        "perf/rows_per_engine_call": scheduler.stats.rows / max(scheduler.stats.engine_calls, 1),
                        "perf/chunks_continued": float(scheduler.stats.chunks_continued)}
            for name, coalescer in coalescers.items():
                counters[f"perf/{name}_calls"] = float(coalescer.calls)
                counters[f"perf/{by_name[name].items}_per_{name}_call"] = coalescer.items / max(coalescer.calls, 1)
            return counters

        async def call(name: str, key: int, item: Any) -> Any:
            if name in coalescers:
                return await coalescers[name].submit(item)
            return (await by_name[name].fn([item]))[0]

        async def batch(name: str, items: list[Any]) -> list[Any]:
            if name in coalescers:
                return list(await asyncio.gather(*(coalescers[name].submit(item) for item in items)))
            return await by_name[name].fn(items)

        return _IO(generate=scheduler.generate, call=call, batch=batch, leave=lambda: None, stats=stats,
                   abort=scheduler.abort_unfinished)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _context(self, index: int, turn: int, row: Trajectory, ids: list[int], calls: _Calls) -> TurnContext:
        return TurnContext(index, turn, row, ids, self.data.max_trajectory_length, self.data.max_prompt_length,
                           calls)

    async def _trajectory(self, index: int, row: Trajectory, io: _IO, calls: _Calls, logprobs: bool,
                          turn_prefix: TurnPrefixFn | None) -> None:
        """One row's turns: (forced prefix), generate, then act / answer / feedback, until it ends."""
        try:
            for turn in range(self.max_turns + 1):
                forced = turn_prefix(index, turn, row) if turn_prefix is not None else []
                if forced and not self._context(index, turn, row, [], calls).insert(list(forced)):
                    break
                final = turn == self.max_turns
                left = self.data.max_trajectory_length - len(row.response_ids)
                budget = min(self.data.max_response_length, left)
                out = await io.generate(index, turn, row.prompt_ids + row.response_ids, budget)
                ids = out.token_ids[:budget]
                row.num_turns += 1
                row.append(ids, sampled=True, log_probs=out.logprobs[:budget] if logprobs else None,
                           versions=out.versions[:budget] if out.versions else None)
                kind, content = self.format.parse(ids, out, cut=len(ids) < len(out.token_ids))
                ctx = self._context(index, turn, row, ids, calls)
                if kind is ActionKind.ACT and not final:
                    await self.format.act(ctx, content)
                elif kind is ActionKind.LENGTH:
                    self._settle_cut_turn(ctx, len(ids) >= left, final)
                else:
                    self._settle(ctx, kind, final)
                if row.stop_reason is not None:
                    break
        finally:
            io.leave()

    def _settle(self, ctx: TurnContext, kind: ActionKind, final: bool) -> None:
        """Apply a turn's action other than an executed one to its row."""
        row = ctx.row
        if kind is ActionKind.INVALID or kind is ActionKind.EOS:
            row.num_invalid += 1
        if kind is ActionKind.ANSWER:
            row.stop_reason = StopReason.ANSWERED
        elif kind is ActionKind.EOS:
            row.stop_reason = StopReason.EOS_WITHOUT_ANSWER
        elif final:  # an action or an invalid one in the final turn
            row.stop_reason = StopReason.MAX_TURNS
        else:
            ctx.insert(self.format.feedback(ctx))

    def _settle_cut_turn(self, ctx: TurnContext, trajectory_full: bool, final: bool) -> None:
        """A turn that ended at a length budget before any action. At the trajectory's budget the row ends;
        at the per-turn budget it is Search-R1's invalid action (feedback, next turn), or the end in the final turn."""
        if trajectory_full:
            ctx.cut(TRAJECTORY_BUDGET)
            return
        ctx.row.turns_cut += 1
        ctx.row.num_invalid += 1
        if final:
            ctx.cut(TURN_BUDGET)
        else:
            ctx.insert(self.format.feedback(ctx))

    def _warn_length_losses(self, rows: list[Trajectory]) -> None:
        """Warn (once per budget and loop) when one length budget cost more than LENGTH_WARN_FRAC of a call's rows
        an action or an answer: the policy would be trained on trajectories that cannot act or answer."""
        for key, lost in length_losses(rows).items():
            if key in self._warned_budgets or lost <= LENGTH_WARN_FRAC * len(rows):
                continue
            self._warned_budgets.add(key)
            value = {TURN_BUDGET: self.data.max_response_length, TRAJECTORY_BUDGET: self.data.max_trajectory_length,
                     CONTEXT_BUDGET: self.data.max_prompt_length}[key]
            logger.warning("%d of %d trajectories lost an action or an answer to %s=%d tokens (agent/cut/%s): raise "
                           "it, or lower data.max_obs_length (or what the environment inserts); see docs/design.md, "
                           "Lengths", lost, len(rows), key, value, key.split(".")[-1])

    def _start(self, prompt: list[int], index: int) -> Trajectory:
        if len(prompt) > self.data.max_prompt_length:
            raise ValueError(f"prompt {index} has {len(prompt)} tokens > data.max_prompt_length="
                             f"{self.data.max_prompt_length}; the dataset should have dropped it")
        if not prompt:
            raise ValueError(f"prompt {index} is empty")
        cut = len(prompt) > self.data.max_start_length
        return self.format.row_type(prompt_ids=prompt[-self.data.max_start_length:], prompt_truncated=cut)

    def __call__(self, batch: Batch, params: SamplingParams) -> Batch:
        """The trainer's generation function.

        Reads ``batch.non_tensors["raw_prompt_ids"]`` (token ids per row, chat template applied).
        Returns the tensors of ``pack_trajectories`` ([B, P], [B, R], [B, P + R] ...; with
        ``params.logprobs`` also ``rollout_log_probs`` [B, R]), every input non-tensor column, the
        non-tensors ``stop_reason`` (str), ``truncated`` (bool: the stop reason is ``MAX_LENGTH``, the length
        budget cut the row), ``num_turns``, the format's own columns (``ActionFormat.columns``), ``min_version``
        and ``max_version`` (int: the oldest / newest policy version that sampled the row, -1 = unknown), the
        input meta and ``meta["gen_metrics"]``.
        """
        prompts = [[int(t) for t in ids] for ids in batch.non_tensors["raw_prompt_ids"]]
        result = self.run(prompts, params)
        trajs = result.trajectories
        tensors = pack_trajectories([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                                    [t.info_mask for t in trajs], pad_token_id(self.tokenizer),
                                    [t.rollout_log_probs for t in trajs] if params.logprobs else None)
        non_tensors = dict(batch.non_tensors)
        non_tensors["stop_reason"] = [t.stop_reason.value for t in trajs]
        non_tensors["truncated"] = [t.stop_reason is StopReason.MAX_LENGTH for t in trajs]
        non_tensors["num_turns"] = [t.num_turns for t in trajs]
        non_tensors.update(self.format.columns(trajs))
        ranges = [t.version_range() for t in trajs]  # policy versions of each row's sampled ids
        non_tensors["min_version"] = [oldest for oldest, _ in ranges]
        non_tensors["max_version"] = [newest for _, newest in ranges]
        return Batch(tensors, non_tensors, {**batch.meta, "gen_metrics": result.metrics()})
