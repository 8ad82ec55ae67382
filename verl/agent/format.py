"""The seam between the agent loop and a task: an action format, the ``TurnContext`` it acts on, and the
environment calls (``Service``) it makes.

An action format says how a policy acts and what the environment answers: its turns' stop strings, how a turn's
sampled ids become an action (``parse``), what runs for an action and what is inserted after it (``act``), and
the feedback after a turn with no well-formed action (``feedback``). It works on one row's ``TurnContext``
(``insert`` ids if they fit the budgets, ``lacking``: the budget a block would break, ``cut``: end the row at a
budget, ``call``: ask the environment), never on the loop's state, so a new format is one small class
(``examples/calculator.py``; the search task's: ``search_r1/llm_agent/tags.py`` and ``hermes.py``, for example).

A format registers itself under the name the config key ``actor_rollout_ref.rollout.multi_turn.format`` takes
(``verl.tools.register_format``). Environment calls that may wait (an HTTP service) are declared as ``Service``s:
the loop batches them over rows as its schedule says (``rollout.mode``: in lockstep, all rows' items of a turn in
one call, services before generation; async, a blocking service's items that arrive together coalesced into one
call). Light at import (no torch).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from verl.agent.trajectory import CONTEXT_BUDGET, TRAJECTORY_BUDGET, ActionKind, StopReason, Trajectory

if TYPE_CHECKING:
    from verl.workers.rollout.base import GenerationOutput


def parse_tagged(text: str, finish_reason: str, stop_str: str | None, cut: bool, act_tag: str,
                 answer_tag: str = "answer") -> tuple[ActionKind, str]:
    """The action of one turn written in tags: ``<act_tag> content </act_tag>`` (ACT, content non-empty) or
    ``<answer_tag> content </answer_tag>`` (ANSWER) at the end of the turn's decoded ``text`` -> (kind, content).

    ``stop_str``: the stop string the engine reports; the text is read up to its last occurrence (a real tokenizer's
    last token may carry characters past the tag). ``cut``: the loop cut the output to the row's remaining budget
    (the engine's stop, if any, came later). A closing tag without its opening one, or an empty action, is INVALID;
    no closing tag is LENGTH when the budget ended the turn, else EOS."""
    end = text.rfind(stop_str) if stop_str and not cut else -1
    stripped = text[:end + len(stop_str)] if end >= 0 else text.rstrip()
    for kind, tag in ((ActionKind.ANSWER, answer_tag), (ActionKind.ACT, act_tag)):
        if stripped.endswith(f"</{tag}>"):
            start = stripped.rfind(f"<{tag}>")
            content = stripped[start + len(tag) + 2:-len(tag) - 3].strip() if start >= 0 else ""
            if start < 0 or (kind is ActionKind.ACT and not content):
                return ActionKind.INVALID, ""
            return kind, content
    if cut or finish_reason == "length":
        return ActionKind.LENGTH, ""
    if finish_reason != "stop":
        raise ValueError(f"engine returned finish_reason={finish_reason!r}; expected 'stop' or 'length'")
    return ActionKind.EOS, ""


@dataclass(frozen=True)
class Service:
    """One kind of environment call: ``fn(items) -> one result per item``, items of any rows.

    ``blocking``: ``fn`` is a plain function that blocks (an HTTP request): the loop runs it in its thread pool and,
    in async mode, coalesces the items that arrive within ``coalesce_s`` of the first waiting one (at most
    ``max_batch`` per call, ``max_inflight`` calls at once; logged as ``perf/<name>_calls`` and
    ``perf/<items>_per_<name>_call``). Otherwise ``fn`` is a coroutine function, called with one row's item in async
    mode."""

    name: str
    fn: Callable[[list[Any]], list[Any]] | Callable[[list[Any]], Awaitable[list[Any]]]
    blocking: bool = True
    coalesce_s: float = 0.005
    max_batch: int = 512
    max_inflight: int = 4
    items: str = "items"  # what one item is, in the metrics' names


class Calls(Protocol):
    """The environment calls of one run (the loop's, per schedule)."""

    def call(self, name: str, row: int, item: Any) -> Awaitable[Any]:
        """Row ``row``'s ``item`` for service ``name``, batched with other rows' as the schedule says."""

    def batch(self, name: str, items: list[Any]) -> Awaitable[list[Any]]:
        """Several items for service ``name`` at once, from inside another service's call (not scheduled again)."""


@dataclass
class TurnContext:
    """One row's turn, as an action format sees it: the row, the ids it sampled, and what the format may do."""

    index: int  # the row's index in the loop's call
    turn: int
    row: Trajectory
    ids: list[int]  # what the policy sampled this turn
    max_trajectory_length: int  # data.max_trajectory_length
    max_prompt_length: int  # data.max_prompt_length
    calls: Calls

    def lacking(self, num_ids: int) -> str | None:
        """The budget that ``num_ids`` more inserted ids would break (None = they fit): the trajectory must keep the
        policy at least one token, and the next turn's context must stay within max_prompt_length."""
        row = self.row
        if len(row.response_ids) + num_ids >= self.max_trajectory_length:
            return TRAJECTORY_BUDGET
        if len(row.prompt_ids) + len(row.response_ids) + num_ids > self.max_prompt_length:
            return CONTEXT_BUDGET
        return None

    def cut(self, budget: str) -> None:
        """End the row: ``budget`` (a config key, e.g. ``TRAJECTORY_BUDGET``) leaves no room for what comes next."""
        self.row.stop_reason = StopReason.MAX_LENGTH
        self.row.cut_by = budget

    def insert(self, ids: list[int]) -> bool:
        """Append environment ids (info_mask 0) if they fit the trajectory and context budgets; else end the row."""
        lacking = self.lacking(len(ids))
        if lacking is not None:
            self.cut(lacking)
            return False
        self.row.append(ids, sampled=False)
        return True

    async def call(self, service: str, item: Any) -> Any:
        """The environment's answer to ``item`` (service ``service``); the wait is counted in ``row.env_wait_s``."""
        start = time.perf_counter()
        try:
            return await self.calls.call(service, self.index, item)
        finally:
            self.row.env_wait_s += time.perf_counter() - start


class ActionFormat(Protocol):
    """How the policy acts in the loop (module docstring). Subclass it: ``parse``, ``act`` and ``feedback`` are the
    format's; the rest have defaults for a format with no services, counters or columns of its own."""

    stop: ClassVar[list[str]]  # stop strings of a turn (the engine also stops at eos)
    uses_tools: ClassVar[bool] = False  # the prompts show the run's tools (verl.tools.run_tool_specs)
    row_type: ClassVar[type[Trajectory]] = Trajectory  # a subclass adds the format's own per-row counters

    def parse(self, ids: list[int], out: GenerationOutput, cut: bool) -> tuple[ActionKind, Any]:
        """One turn's sampled ``ids`` (``out``: the engine's output; ``cut``: the loop cut it to the row's budget)
        -> (kind, the action's content: what ``act`` receives for ``ActionKind.ACT``)."""
        ...

    async def act(self, ctx: TurnContext, action: Any) -> None:
        """Execute an ``ActionKind.ACT`` turn that is not the final one: ask the environment (``ctx.call``) and
        insert its answer (``ctx.insert``; a block that does not fit ends the row)."""
        ...

    def feedback(self, ctx: TurnContext) -> list[int]:
        """The ids inserted after a turn with no well-formed action (the loop inserts them)."""
        ...

    def services(self, calls: Calls) -> list[Service]:
        """The environment calls this format makes, in the lockstep's priority order; called at the start of each
        run (``calls``: that run's, for a service that calls another)."""
        return []

    def finish(self, rows: list[Trajectory]) -> None:
        """After a run: warn about what the format counted (e.g. observations cut to their budget)."""

    def metrics(self, rows: list[Trajectory]) -> dict[str, float]:
        """The format's own per-step metrics (``agent/...``), added to the loop's."""
        return {}

    def columns(self, rows: list[Trajectory]) -> dict[str, list]:
        """The format's own per-row non-tensor columns of the generated batch (declared by the task's recipe)."""
        return {}
