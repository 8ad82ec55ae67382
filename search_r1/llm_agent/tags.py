"""Search-R1's tag format of the agent loop (``verl.agent.loop``), registered as ``multi_turn.format=search_r1``:
the policy writes ``<search> q </search>`` or ``<answer> a </answer>`` in free text; a search gets an
``<information>`` block of passages (``formatting``), a turn with no well-formed action the feedback text. The other
format of the search task is ``hermes.py``.

Choices (as Search-R1): invalid actions (a stop tag without its opening tag, an empty query) get feedback and cost a
turn; the feedback never contains literal tags (``formatting``). An observation is the tokenisation of the whole
block when it fits in ``data.max_obs_length`` tokens, else truncated by cutting the passages and then closing the
block (counted in ``agent/truncated_obs``, and named in a warning when most are cut); a block that does not fit the
trajectory or context budget is not appended and ends the row (``TurnContext.insert``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from search_r1.llm_agent.formatting import INFO_CLOSE, INFO_OPEN, INVALID_ACTION_FEEDBACK, observation_ids
from search_r1.llm_agent.search_env import (
    RETRIEVAL,
    TRUNCATED_OBS_WARN_FRAC,
    SearchEnv,
    SearchFormat,
    SearchTrajectory,
)
from verl.agent.format import TurnContext, parse_tagged
from verl.agent.trajectory import ActionKind
from verl.tools import register_format

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from verl.config import DataConfig, MultiTurnConfig
    from verl.workers.rollout.base import GenerationOutput

logger = logging.getLogger(__name__)

STOP_STRINGS = ["</search>", "</answer>"]


def parse_action(text: str, finish_reason: str, stop_str: str | None, cut: bool) -> tuple[ActionKind, str]:
    """The action of one turn from its decoded text -> (kind, query or answer text): ``<search> q </search>`` is
    ``ActionKind.ACT``, ``<answer> a </answer>`` ANSWER (``verl.agent.format.parse_tagged``)."""
    return parse_tagged(text, finish_reason, stop_str, cut, act_tag="search")


@register_format("search_r1")
class TagFormat(SearchFormat):
    """Search-R1's tags (module docstring)."""

    stop = STOP_STRINGS

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env: SearchEnv, multi: MultiTurnConfig,
                 data: DataConfig) -> None:
        super().__init__(tokenizer, env)
        self.max_obs_length = data.max_obs_length
        self._open_ids, self._close_ids, self._feedback_ids = tokenizer(
            [INFO_OPEN, INFO_CLOSE, INVALID_ACTION_FEEDBACK], add_special_tokens=False)["input_ids"]
        observation_ids(tokenizer, [], self.max_obs_length)  # fails now if it leaves no passage room
        self._warned_obs = False

    def parse(self, ids: list[int], out: GenerationOutput, cut: bool) -> tuple[ActionKind, str]:
        return parse_action(self.tokenizer.decode(ids, skip_special_tokens=True), out.finish_reason, out.stop_str,
                            cut)

    def feedback(self, ctx: TurnContext) -> list[int]:
        return self._feedback_ids

    async def act(self, ctx: TurnContext, action: Any) -> None:
        """The passages for the query ``action`` as an <information> block (an empty block when do_search is off)."""
        lacking = ctx.lacking(len(self._open_ids) + len(self._close_ids))
        if lacking is not None:  # not even an empty block fits: no request
            ctx.cut(lacking)
            return
        docs: list[dict] = await ctx.call(RETRIEVAL, action) if self.env.do_search else []
        (block, truncated), = observation_ids(self.tokenizer, [docs], self.max_obs_length)
        if ctx.insert(block):
            row: SearchTrajectory = ctx.row
            row.num_searches += 1
            row.queries.append(action)
            row.truncated_obs += truncated

    def finish(self, rows: list[SearchTrajectory]) -> None:
        """Warn (once per format object, i.e. once per run) when more than TRUNCATED_OBS_WARN_FRAC of a call's
        searches had their passages cut: the policy then reads fragments, silently, unless the budget is raised."""
        searches, cut = sum(r.num_searches for r in rows), sum(r.truncated_obs for r in rows)
        if self._warned_obs or searches == 0 or cut <= TRUNCATED_OBS_WARN_FRAC * searches:
            return
        self._warned_obs = True
        logger.warning("%d of %d searches returned more than data.max_obs_length=%d tokens of passages and were cut "
                       "(agent/truncated_obs): raise data.max_obs_length (Search-R1 uses 500 for 3 passages) or "
                       "lower retriever.topk", cut, searches, self.max_obs_length)
