"""The search agent (Search-R1): the generic agent loop (``verl.agent.loop.AgentLoop``) with the search task's action
format and its retrieval service.

The policy thinks, then searches or answers, until done: in Search-R1's tags (``tags.TagFormat``,
``multi_turn.format=search_r1``, the recipe's ``DEFAULT_FORMAT``) or in the chat template's tool calls
(``hermes.HermesFormat``, ``format=hermes``); both give the same trajectory structure (docs/design.md, "Action
formats"). ``max_turns`` turns may search (``multi_turn.max_assistant_turns`` replaces ``max_turns + 1`` when set);
one final turn follows in which a search is no longer executed. The loop's lengths, schedule and masks are the
loop's (``verl.agent.loop``); the retrieval service's requests are batched as the schedule says
(``search_env.SearchEnv``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from search_r1.config import SearchConfig
from search_r1.llm_agent import hermes, tags  # noqa: F401 -- register the action formats
from search_r1.llm_agent.search_env import SearchEnv, SearchTrajectory
from verl.agent.loop import AgentLoop, TurnPrefixFn
from verl.agent.trajectory import ActionKind, AgentResult, StopReason
from verl.tools import action_format

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from search_r1.search.client import RetrievalClient
    from verl.workers.rollout.base import Generator

__all__ = ["ActionKind", "AgentLoop", "AgentResult", "SearchTrajectory", "StopReason", "TurnPrefixFn",
           "search_agent"]


def search_agent(cfg: SearchConfig, tokenizer: PreTrainedTokenizerBase, engine: Generator,
                client: RetrievalClient | None) -> AgentLoop:
    """The search loop over ``engine`` (one engine, or the engines of all ranks) and ``client`` (None with
    ``do_search=false`` or search disabled, ``max_turns=0``), in the action format ``cfg`` names, with its lengths and
    schedule."""
    retriever, rollout = cfg.retriever, cfg.actor_rollout_ref.rollout
    if client is not None and client.topk != retriever.topk:
        raise ValueError(f"client topk={client.topk} differs from retriever.topk={retriever.topk}")
    env = SearchEnv(client, cfg.retrieves, retriever.coalesce_ms, retriever.coalesce_max, retriever.max_inflight)
    fmt = action_format(cfg)(tokenizer, env, rollout.multi_turn, cfg.data)
    return AgentLoop(tokenizer, engine, fmt, cfg.data, rollout, cfg.max_turns)
