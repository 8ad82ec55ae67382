"""The multi-turn search loop (Search-R1): think, then search or answer, until done.

How the policy acts is its action format (``multi_turn.format``): Search-R1's tags (``tags.TagActions``, the
default, described below) or the chat template's tool calls (``hermes.HermesActions``: tool messages in place of
``<information>`` blocks, a turn ending at the template's end-of-turn token). Both give the turn loop below the same
interface and the same trajectory structure (docs/design.md, "Action formats").

Every row runs its own turn loop (``_trajectory``, one asyncio task per row): generate until
``</search>`` or ``</answer>``; a search gets its passages from the retrieval service, rendered as an
``<information>`` block; a turn with no well-formed action gets a feedback text; a turn that answered
ends the row. After ``max_turns`` turns that may search, one final turn runs in which a search is no
longer executed: the row ends after it whatever it wrote. The rows' requests are served by one of
two schedules (``actor_rollout_ref.rollout.mode``; ``verl.workers.rollout.scheduler``):

- ``sync`` (lockstep): each turn is ONE engine call for all active rows, then ONE batched retrieval for
  all rows that searched; a row waits for the slowest row of its turn. Same calls, in the same order,
  with the same seeds, as the turn-by-turn loop this replaced.
- ``async``: no barrier. A row that finished its turn goes to retrieval at once while others still
  generate, and back to an engine as soon as its passages are in; each engine batches whatever is
  pending (``EngineScheduler``: least-loaded engine, the previous turn's engine preferred; turns cut
  into ``rollout.async_chunk_tokens`` chunks); searches that arrive within ``retriever.coalesce_ms``
  go out as one request (``Coalescer``). Each row samples with its own seeds, so its tokens do not
  depend on which rows shared an engine call; with greedy decoding both schedules give the same
  trajectories up to floating-point differences of batch composition (docs/results.md).

Choices, and where they differ from Search-R1:

- Token-in/token-out. A row's response is exactly the ids the engine sampled plus the ids of the
  inserted blocks, in order; sampled ids are decoded only to parse the action. (Search-R1 decodes
  and re-tokenises the whole rollout, which can change the tokens the loss is computed on.)
- ``info_mask`` is built while the response grows: 1 = sampled by the policy (trained),
  0 = inserted by the environment (context only). The trainer's ``loss_mask`` is
  ``response_mask * info_mask`` (docs/design.md, "Masks").
- Lengths mean what they mean in Search-R1 (docs/design.md, "Lengths"): ``max_start_length`` caps the
  initial prompt (its last tokens are kept, counted), ``max_response_length`` is what ONE turn may sample,
  ``max_obs_length`` one ``<information>`` block, ``max_prompt_length`` the context a turn conditions on
  (prompt + response so far), and ``max_trajectory_length`` the whole response (every turn's sampled and
  inserted tokens; Search-R1 cuts its response to ``max_prompt_length``). A turn cut at
  ``max_response_length`` before any action is an invalid action, as in Search-R1: it gets the feedback
  text and the row goes on (counted in ``agent/cut/max_response_length``); in the final turn it ends the
  row with ``MAX_LENGTH``.
- The rolling context is never cut. The engine always continues ``prompt + response so far``, the exact
  sequence the actor later scores. Where Search-R1 left-cuts the context to ``max_prompt_length`` (so its
  engine samples under a context the actor never sees), an insertion that would take the context past
  ``max_prompt_length`` ends the row with ``MAX_LENGTH`` instead. A prompt longer than
  ``max_prompt_length`` is an error: the dataset drops such rows.
- Every cut is counted under the key of the budget that made it (``Trajectory.cut_by``,
  ``agent/cut/<key>``), and a budget that costs more than ``LENGTH_WARN_FRAC`` of a call's rows a search
  or an answer is named in a warning. A call for several rows asks for the largest per-row budget and
  cuts each row's output to its own. An observation is the tokenisation of the whole block when it fits
  in ``max_obs_length`` tokens, else truncated by cutting the passages and then closing the block
  (counted; ``formatting.observation_ids``); an inserted block that would leave the policy no token of
  trajectory budget, or the next turn more context than ``max_prompt_length``, is not appended and ends
  the row with ``MAX_LENGTH`` (the search is lost, counted under that budget).
- Forced prefixes (``run(..., turn_prefix=fn)``, evaluation only): before a turn, ``fn`` may insert
  ids at the start of a row's turn (e.g. the first words of a search decision) to measure the policy
  with a behaviour forced; they are inserted ids (info_mask 0) and count towards the budget. The
  trainer never passes one.
- Invalid actions (a stop tag without its opening tag, an empty query) get feedback and cost a
  turn. The feedback never contains literal tags (see ``formatting``). EOS without an answer ends
  the row: the policy said it is done, and text appended after its EOS would be off-distribution.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search_r1.config import SearchConfig
from search_r1.llm_agent.hermes import HermesActions
from search_r1.llm_agent.tags import STOP_STRINGS, TagActions, parse_action  # noqa: F401 -- re-exported
from search_r1.llm_agent.trajectory import (
    CONTEXT_BUDGET,
    LENGTH_WARN_FRAC,
    TRAJECTORY_BUDGET,
    TRUNCATED_OBS_WARN_FRAC,
    TURN_BUDGET,
    ActionKind,
    AgentResult,
    StopReason,
    Trajectory,
    length_losses,
)
from verl.protocol import Batch
from verl.tools import read_tool_config
from verl.utils.seq import pack_trajectories
from verl.utils.tokenizer import pad_token_id
from verl.workers.rollout.base import GenerationOutput, Generator, SamplingParams, as_pool
from verl.workers.rollout.scheduler import Coalescer, EngineScheduler, Lockstep

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from search_r1.search.client import RetrievalClient
    from verl.tools import ToolSpec

logger = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    """Settings of the loop; lengths are in tokens."""

    max_turns: int  # turns whose searches are executed; one final answer turn follows
    max_start_length: int  # prompts are cut to their last max_start_length tokens
    max_prompt_length: int  # the context of a turn (prompt + response so far); a longer prompt is an error
    max_response_length: int  # tokens one turn may sample
    max_obs_length: int  # one inserted <information> block, tags included
    do_search: bool  # false = every search gets an empty <information> block, no request
    topk: int  # passages per search; must equal the client's topk
    max_trajectory_length: int  # the whole response: every turn's sampled + inserted tokens
    mode: str = "sync"  # sync | async (module docstring)
    chunk_tokens: int = 0  # async: tokens per request per engine round (0 = the whole turn)
    coalesce_ms: float = 5.0  # async: searches arriving within this of the first waiting one share a request
    coalesce_max: int = 512  # async: at most this many queries per request
    max_inflight_searches: int = 4  # async: retrieval requests running at once
    format: str = "search_r1"  # search_r1 (tags) | hermes (chat-template tool calls; hermes.py)
    tools: list[ToolSpec] | None = None  # hermes: the tools offered (None = the built-in search tool)
    max_tool_response_length: int | None = None  # hermes: tokens of one tool result (None = max_obs_length)
    max_parallel_calls: int = 4  # hermes: calls executed per turn

    @classmethod
    def from_config(cls, cfg: SearchConfig) -> AgentConfig:
        r, rollout = cfg.retriever, cfg.actor_rollout_ref.rollout
        multi = rollout.multi_turn
        return cls(max_turns=cfg.max_turns if multi.max_assistant_turns is None else multi.max_assistant_turns - 1,
                   max_start_length=cfg.data.max_start_length,
                   max_prompt_length=cfg.data.max_prompt_length, max_response_length=cfg.data.max_response_length,
                   max_obs_length=cfg.data.max_obs_length, do_search=cfg.do_search, topk=r.topk,
                   max_trajectory_length=cfg.data.max_trajectory_length,
                   mode=rollout.mode, chunk_tokens=rollout.async_chunk_tokens,
                   coalesce_ms=r.coalesce_ms, coalesce_max=r.coalesce_max, max_inflight_searches=r.max_inflight,
                   format=multi.format,
                   tools=None if multi.tool_config_path is None else read_tool_config(multi.tool_config_path),
                   max_tool_response_length=multi.max_tool_response_length,
                   max_parallel_calls=multi.max_parallel_calls)



# (row index, turn index, the row's trajectory so far) -> ids inserted at the start of that row's turn ([] = none)
TurnPrefixFn = Callable[[int, int, Trajectory], list[int]]


@dataclass
class _IO:
    """What a row's loop awaits, as the schedule provides it."""

    generate: Callable[[int, int, list[int], int], Awaitable[GenerationOutput]]  # (row, turn, context, budget)
    search: Callable[[int, str], Awaitable[list[dict]]]  # (row, query) -> passages
    tools: Callable[[int, list], Awaitable[list[str]]]  # hermes: (row, its well-formed ToolCalls) -> results
    leave: Callable[[], None]  # a row ended
    stats: Callable[[], dict[str, float]]
    abort: Callable[[], None] = lambda: None  # after a failed run, once no engine call runs: drop unfinished requests


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


class LLMGenerationManager:
    """Runs the search loop for a batch of prompts with any ``Generator`` (one engine, or the engines of all ranks)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, engine: Generator, client: RetrievalClient | None,
                 cfg: AgentConfig) -> None:
        if cfg.do_search and client is None:
            raise ValueError("do_search=true needs a RetrievalClient (or set do_search=false)")
        if client is not None and client.topk != cfg.topk:
            raise ValueError(f"client topk={client.topk} differs from retriever.topk={cfg.topk}")
        self.tokenizer = tokenizer
        self.engine = engine
        self.client = client
        self.cfg = cfg
        self._retrieve: Callable[[list[str]], Awaitable[list[list[dict]]]] | None = None  # set per run (the schedule's)
        self.actions = HermesActions(self) if cfg.format == "hermes" else TagActions(self)
        self._warned_obs = False
        self._warned_budgets: set[str] = set()  # length budgets already named in a warning

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def run(self, prompt_ids: list[list[int]], params: SamplingParams,
            turn_prefix: TurnPrefixFn | None = None) -> AgentResult:
        """Roll out every prompt until it answers or runs out of turns or budget.

        ``params`` sets the sampling (temperature, top-p, ...); the loop sets ``max_tokens`` and
        ``stop`` per turn, and needs ``params.n == 1`` (the trainer repeats rows for n samples).
        ``turn_prefix`` (evaluation only) inserts forced ids at the start of a row's turn (module docstring).
        """
        if params.n != 1:
            raise ValueError(f"the search loop samples one trajectory per row; got n={params.n} "
                             "(repeat the rows instead)")
        rows = [self._start(list(p), i) for i, p in enumerate(prompt_ids)]
        start = time.perf_counter()
        stats = run_coroutine(lambda: self._run_all(rows, dataclasses.replace(params, stop=list(self.actions.stop)),
                                                    turn_prefix))
        truncated = sum(r.prompt_truncated for r in rows)
        if truncated:
            logger.warning("%d of %d prompts were cut to data.max_start_length=%d tokens", truncated, len(rows),
                           self.cfg.max_start_length)
        self.actions.warn(rows)  # the format's cut observations
        self._warn_length_losses(rows)
        return AgentResult(rows, wall_s=time.perf_counter() - start, schedule=stats)

    async def _run_all(self, rows: list[Trajectory], params: SamplingParams,
                       turn_prefix: TurnPrefixFn | None) -> dict[str, float]:
        """Every row's loop as its own task, over the schedule of ``cfg.mode``; the schedule's counters."""
        loop = asyncio.get_running_loop()
        pool = as_pool(self.engine)
        workers = pool.num_engines + self.cfg.max_inflight_searches + 1
        failed = True
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout") as executor:
            def run_blocking(fn, *args):
                return loop.run_in_executor(executor, fn, *args)

            io = self._lockstep_io(rows, params, run_blocking) if self.cfg.mode == "sync" else \
                self._async_io(pool, params, run_blocking)
            tasks = [asyncio.ensure_future(self._trajectory(i, row, io, params.logprobs, turn_prefix))
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

    def _lockstep_io(self, rows: list[Trajectory], params: SamplingParams, run_blocking) -> _IO:
        """``mode: sync``: one engine call per turn for all active rows (``max_tokens`` = the largest remaining
        budget, ``params.seed`` for every turn), one retrieval per turn for all searching rows, searches first."""

        async def generate(requests: list[tuple[list[int], int]]) -> list[GenerationOutput]:
            turn_params = dataclasses.replace(params, max_tokens=max(budget for _, budget in requests))
            outputs = await run_blocking(self.engine.generate, [context for context, _ in requests], turn_params)
            if len(outputs) != len(requests):
                raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(requests)} prompts")
            return outputs

        async def search(queries: list[str]) -> list[list[dict]]:
            return await run_blocking(self._search, queries)

        async def tools(calls_per_row: list[list]) -> list[list[str]]:  # every row's calls of the turn at once
            results = await self.actions.run_calls([call for calls in calls_per_row for call in calls])
            starts = [0, *itertools.accumulate(len(calls) for calls in calls_per_row)]
            return [results[a:b] for a, b in itertools.pairwise(starts)]

        self._retrieve = search
        lockstep = Lockstep(len(rows), [("search", search), ("tools", tools), ("generate", generate)])
        return _IO(generate=lambda key, turn, context, budget: lockstep.submit("generate", key, (context, budget)),
                   search=lambda key, query: lockstep.submit("search", key, query),
                   tools=lambda key, calls: lockstep.submit("tools", key, calls), leave=lockstep.leave,
                   stats=lambda: {})

    def _async_io(self, pool, params: SamplingParams, run_blocking) -> _IO:
        """``mode: async``: the engine scheduler and a coalescer of retrieval requests (``rollout.scheduler``)."""
        seed = params.seed if params.seed is not None else random.getrandbits(62)
        scheduler = EngineScheduler(pool, params, run_blocking, self.cfg.chunk_tokens, self._decode, seed)
        coalescer = Coalescer(self._search, run_blocking, self.cfg.coalesce_ms / 1000, self.cfg.coalesce_max,
                              self.cfg.max_inflight_searches)

        def stats() -> dict[str, float]:
            return {"perf/engine_calls": float(scheduler.stats.engine_calls),
                    "perf/rows_per_engine_call": scheduler.stats.rows / max(scheduler.stats.engine_calls, 1),
                    "perf/chunks_continued": float(scheduler.stats.chunks_continued),
                    "perf/retrieval_calls": float(coalescer.calls),
                    "perf/queries_per_retrieval_call": coalescer.items / max(coalescer.calls, 1)}

        async def retrieve(queries: list[str]) -> list[list[dict]]:
            return list(await asyncio.gather(*(coalescer.submit(q) for q in queries)))

        self._retrieve = retrieve
        return _IO(generate=scheduler.generate, search=lambda key, query: coalescer.submit(query),
                   tools=lambda key, calls: self.actions.run_calls(calls), leave=lambda: None, stats=stats,
                   abort=scheduler.abort_unfinished)

    def _search(self, queries: list[str]) -> list[list[dict]]:
        docs_per_query = self.client.search(queries)
        if len(docs_per_query) != len(queries):
            raise RuntimeError(f"retrieval returned {len(docs_per_query)} results for {len(queries)} queries")
        return docs_per_query

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def _trajectory(self, index: int, row: Trajectory, io: _IO, logprobs: bool,
                          turn_prefix: TurnPrefixFn | None) -> None:
        """One row's turns: (forced prefix), generate, then search / answer / feedback, until it ends."""
        try:
            for turn in range(self.cfg.max_turns + 1):
                forced = turn_prefix(index, turn, row) if turn_prefix is not None else []
                if forced and not self._insert(row, list(forced)):
                    break
                final = turn == self.cfg.max_turns
                left = self.cfg.max_trajectory_length - len(row.response_ids)
                budget = min(self.cfg.max_response_length, left)
                out = await io.generate(index, turn, row.prompt_ids + row.response_ids, budget)
                ids = out.token_ids[:budget]
                row.num_turns += 1
                row.append(ids, sampled=True, log_probs=out.logprobs[:budget] if logprobs else None,
                           versions=out.versions[:budget] if out.versions else None)
                kind, content = self.actions.parse(ids, out, cut=len(ids) < len(out.token_ids))
                if kind is ActionKind.SEARCH and not final:
                    await self.actions.act(index, row, content, ids, io)
                elif kind is ActionKind.LENGTH:
                    self._settle_cut_turn(row, ids, len(ids) >= left, final)
                else:
                    self._settle(row, ids, kind, final)
                if row.stop_reason is not None:
                    break
        finally:
            io.leave()

    def _warn_truncated_obs(self, rows: list[Trajectory]) -> None:
        """Warn (once per manager, i.e. once per run) when more than TRUNCATED_OBS_WARN_FRAC of a call's searches
        had their passages cut: the policy then reads fragments, silently, unless the budget is raised."""
        searches, cut = sum(r.num_searches for r in rows), sum(r.truncated_obs for r in rows)
        if self._warned_obs or searches == 0 or cut <= TRUNCATED_OBS_WARN_FRAC * searches:
            return
        self._warned_obs = True
        logger.warning("%d of %d searches returned more than data.max_obs_length=%d tokens of passages and were cut "
                       "(agent/truncated_obs): raise data.max_obs_length (Search-R1 uses 500 for 3 passages) or "
                       "lower retriever.topk", cut, searches, self.cfg.max_obs_length)

    def _warn_length_losses(self, rows: list[Trajectory]) -> None:
        """Warn (once per budget and manager) when one length budget cost more than LENGTH_WARN_FRAC of a call's
        rows a search or an answer: the policy would be trained on trajectories that cannot search or answer."""
        for key, lost in length_losses(rows).items():
            if key in self._warned_budgets or lost <= LENGTH_WARN_FRAC * len(rows):
                continue
            self._warned_budgets.add(key)
            value = {TURN_BUDGET: self.cfg.max_response_length, TRAJECTORY_BUDGET: self.cfg.max_trajectory_length,
                     CONTEXT_BUDGET: self.cfg.max_prompt_length}[key]
            logger.warning("%d of %d trajectories lost a search or an answer to %s=%d tokens (agent/cut/%s): raise "
                           "it, or lower data.max_obs_length / retriever.topk; see docs/design.md, Lengths",
                           lost, len(rows), key, value, key.split(".")[-1])

    def _start(self, prompt: list[int], index: int) -> Trajectory:
        if len(prompt) > self.cfg.max_prompt_length:
            raise ValueError(f"prompt {index} has {len(prompt)} tokens > data.max_prompt_length="
                             f"{self.cfg.max_prompt_length}; the dataset should have dropped it")
        if not prompt:
            raise ValueError(f"prompt {index} is empty")
        cut = len(prompt) > self.cfg.max_start_length
        return Trajectory(prompt_ids=prompt[-self.cfg.max_start_length:], prompt_truncated=cut)

    def _settle(self, row: Trajectory, ids: list[int], kind: ActionKind, final: bool) -> None:
        """Apply a turn's action other than an executed search to ``row``."""
        if kind is ActionKind.INVALID or kind is ActionKind.EOS:
            row.num_invalid += 1
        if kind is ActionKind.ANSWER:
            row.stop_reason = StopReason.ANSWERED
        elif kind is ActionKind.EOS:
            row.stop_reason = StopReason.EOS_WITHOUT_ANSWER
        elif final:  # a search or an invalid action in the final turn
            row.stop_reason = StopReason.MAX_TURNS
        else:
            self._insert(row, self.actions.feedback(row, ids))

    def _settle_cut_turn(self, row: Trajectory, ids: list[int], trajectory_full: bool, final: bool) -> None:
        """A turn that ended at a length budget before any action. At the trajectory's budget the row ends;
        at the per-turn budget it is Search-R1's invalid action (feedback, next turn), or the end in the final turn."""
        if trajectory_full:
            self._cut(row, TRAJECTORY_BUDGET)
            return
        row.turns_cut += 1
        row.num_invalid += 1
        if final:
            self._cut(row, TURN_BUDGET)
        else:
            self._insert(row, self.actions.feedback(row, ids))

    def _cut(self, row: Trajectory, budget: str) -> None:
        row.stop_reason = StopReason.MAX_LENGTH
        row.cut_by = budget

    def _lacking(self, row: Trajectory, num_ids: int) -> str | None:
        """The budget that ``num_ids`` more inserted ids would break (None = they fit): the trajectory must keep
        the policy at least one token, and the next turn's context must stay within max_prompt_length."""
        if len(row.response_ids) + num_ids >= self.cfg.max_trajectory_length:
            return TRAJECTORY_BUDGET
        if len(row.prompt_ids) + len(row.response_ids) + num_ids > self.cfg.max_prompt_length:
            return CONTEXT_BUDGET
        return None

    def _insert(self, row: Trajectory, ids: list[int]) -> bool:
        """Append environment ids if they fit the trajectory and context budgets; else end the row."""
        lacking = self._lacking(row, len(ids))
        if lacking is not None:
            self._cut(row, lacking)
            return False
        row.append(ids, sampled=False)
        return True

    def __call__(self, batch: Batch, params: SamplingParams) -> Batch:
        """The trainer's generation function.

        Reads ``batch.non_tensors["raw_prompt_ids"]`` (token ids per row, chat template applied).
        Returns the tensors of ``pack_trajectories`` ([B, P], [B, R], [B, P + R] ...; with
        ``params.logprobs`` also ``rollout_log_probs`` [B, R]), every input non-tensor column, the
        non-tensors ``stop_reason`` (str), ``truncated`` (bool: the stop reason is ``MAX_LENGTH``, the length
        budget cut the row), ``num_turns``, ``num_searches``, ``queries`` (a list per row: what it asked the
        environment, in order), ``min_version`` and ``max_version`` (int: the oldest /
        newest policy version that sampled the row, -1 = unknown), the input meta and ``meta["gen_metrics"]``.
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
        non_tensors["num_searches"] = [t.num_searches for t in trajs]
        non_tensors["queries"] = [list(t.queries) for t in trajs]
        ranges = [t.version_range() for t in trajs]  # policy versions of each row's sampled ids
        non_tensors["min_version"] = [oldest for oldest, _ in ranges]
        non_tensors["max_version"] = [newest for _, newest in ranges]
        return Batch(tensors, non_tensors, {**batch.meta, "gen_metrics": result.metrics()})

