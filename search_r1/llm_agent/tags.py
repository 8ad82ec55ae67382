"""Search-R1's tag format of the search loop (``generation.py``): the policy writes ``<search> q </search>`` or
``<answer> a </answer>`` in free text; a search gets an ``<information>`` block of passages (``formatting``), a turn
with no well-formed action the feedback text. The other format is ``hermes.py``; both give the loop the same
interface (``stop``, ``parse``, ``act``, ``feedback``, ``warn``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from search_r1.llm_agent.formatting import INFO_CLOSE, INFO_OPEN, INVALID_ACTION_FEEDBACK, observation_ids
from search_r1.llm_agent.trajectory import ActionKind, Trajectory
from verl.workers.rollout.base import GenerationOutput

if TYPE_CHECKING:
    from search_r1.llm_agent.generation import LLMGenerationManager

STOP_STRINGS = ["</search>", "</answer>"]


def parse_action(text: str, finish_reason: str, stop_str: str | None, cut: bool) -> tuple[ActionKind, str]:
    """The action of one turn from its decoded text -> (kind, query or answer text).

    ``stop_str``: the stop string the engine reports; the text is read up to its last occurrence
    (a real tokenizer's last token may carry characters past the tag). ``cut``: the loop cut the
    output to the row's remaining budget (the engine's stop, if any, came later).
    """
    end = text.rfind(stop_str) if stop_str and not cut else -1
    stripped = text[:end + len(stop_str)] if end >= 0 else text.rstrip()
    for kind, tag in ((ActionKind.ANSWER, "answer"), (ActionKind.SEARCH, "search")):
        if stripped.endswith(f"</{tag}>"):
            start = stripped.rfind(f"<{tag}>")
            content = stripped[start + len(tag) + 2:-len(tag) - 3].strip() if start >= 0 else ""
            if start < 0 or (kind is ActionKind.SEARCH and not content):
                return ActionKind.INVALID, ""
            return kind, content
    if cut or finish_reason == "length":
        return ActionKind.LENGTH, ""
    if finish_reason != "stop":
        raise ValueError(f"engine returned finish_reason={finish_reason!r}; expected 'stop' or 'length'")
    return ActionKind.EOS, ""


class TagActions:
    """Search-R1's tags: ``<search> q </search>`` gets an ``<information>`` block of passages, an invalid turn the
    feedback text (``formatting``)."""

    stop = STOP_STRINGS

    def __init__(self, agent: LLMGenerationManager) -> None:
        self.agent = agent
        self._open_ids, self._close_ids, self._feedback_ids = agent._encode([INFO_OPEN, INFO_CLOSE,
                                                                             INVALID_ACTION_FEEDBACK])
        observation_ids(agent.tokenizer, [], agent.cfg.max_obs_length)  # fails now if it leaves no passage room

    def parse(self, ids: list[int], out: GenerationOutput, cut: bool) -> tuple[ActionKind, str]:
        return parse_action(self.agent._decode(ids), out.finish_reason, out.stop_str, cut)

    def feedback(self, row: Trajectory, ids: list[int]) -> list[int]:
        return self._feedback_ids

    def warn(self, rows: list[Trajectory]) -> None:
        """<information> blocks cut to data.max_obs_length (``LLMGenerationManager._warn_truncated_obs``)."""
        self.agent._warn_truncated_obs(rows)

    async def act(self, index: int, row: Trajectory, query: str, ids: list[int], io: Any) -> None:
        """The passages for ``query`` as an <information> block (an empty block when do_search is off)."""
        agent = self.agent
        lacking = agent._lacking(row, len(self._open_ids) + len(self._close_ids))
        if lacking is not None:  # not even an empty block fits: no request
            agent._cut(row, lacking)
            return
        docs: list[dict] = []
        if agent.cfg.do_search:
            start = time.perf_counter()
            docs = await io.search(index, query)
            row.retrieval_wait_s += time.perf_counter() - start
        (block, truncated), = observation_ids(agent.tokenizer, [docs], agent.cfg.max_obs_length)
        if agent._insert(row, block):
            row.num_searches += 1
            row.queries.append(query)
            row.truncated_obs += truncated
