"""What the search task's two action formats share: its trajectory record, its environment (the retrieval
service) and its metrics and columns.

- ``SearchTrajectory``: the loop's ``verl.agent.trajectory.Trajectory`` plus the searches' counters (and the hermes
  format's tool-call ones), the ``row_type`` of both formats.
- ``SearchEnv``: the retrieval service as the loop's ``retrieval`` service (``verl.agent.format.Service``): in
  lockstep, all rows' queries of a turn in one ``/retrieve`` request; async, queries that arrive within
  ``retriever.coalesce_ms`` coalesced (``retriever.coalesce_max``, ``retriever.max_inflight``).
- ``SearchFormat``: the base of ``tags.TagFormat`` and ``hermes.HermesFormat``: the metrics
  (``agent/searches_per_traj``, ``agent/retrieval_wait_s``, ...) and columns (``num_searches``, ``queries``) that
  both formats report, so a run's metrics have the same keys in either format (0 where a format has no such thing).

Light at import (no torch): the formats register themselves when the config is checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from verl.agent.format import ActionFormat, Calls, Service
from verl.agent.trajectory import Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from search_r1.search.client import RetrievalClient

# Share of a call's searches whose passages were cut to max_obs_length above which a format warns (once).
TRUNCATED_OBS_WARN_FRAC = 0.5
RETRIEVAL = "retrieval"  # the name of the retrieval service (perf/retrieval_calls, perf/queries_per_retrieval_call)


@dataclass
class SearchTrajectory(Trajectory):
    """A trajectory of the search task: the loop's fields and the search's counters."""

    num_searches: int = 0  # searches answered with their passages (tags: an <information> block)
    # what the environment was asked, in order: each search's query (tags), each tool call (hermes: a search's
    # query, another tool's name(arguments)); only the actions whose answer was inserted
    queries: list[str] = field(default_factory=list)
    truncated_obs: int = 0  # <information> blocks cut to max_obs_length (hermes: tool results cut to their budget)
    num_tool_calls: int = 0  # hermes: well-formed tool calls executed
    num_invalid_calls: int = 0  # hermes: tool calls answered with an error message (malformed, unknown, over the limit)
    tokenization_mismatch: int = 0  # hermes: insertions whose ids differ from a full re-render (ChatFormat.check)
    # hermes: per turn whose answer was inserted: (assistant content, the sampled end-of-turn id or None, the
    # messages inserted after it, their ids) -- the conversation the sanity check re-renders
    chat_turns: list[tuple[str, int | None, list[dict], list[int]]] = field(default_factory=list)


@dataclass
class SearchEnv:
    """The retrieval service as the formats use it: ``client`` (None when ``do_search`` is false) and the async
    schedule's coalescing of its requests (``retriever.*``)."""

    client: RetrievalClient | None
    do_search: bool  # false = every search gets an empty block, no request
    coalesce_ms: float = 5.0
    coalesce_max: int = 512
    max_inflight: int = 4

    def __post_init__(self) -> None:
        if self.do_search and self.client is None:
            raise ValueError("do_search=true needs a RetrievalClient (or set do_search=false)")

    def search(self, queries: list[str]) -> list[list[dict]]:
        """The passages of each query, in one request (blocking)."""
        docs_per_query = self.client.search(queries)
        if len(docs_per_query) != len(queries):
            raise RuntimeError(f"retrieval returned {len(docs_per_query)} results for {len(queries)} queries")
        return docs_per_query

    def service(self) -> Service:
        return Service(RETRIEVAL, self.search, blocking=True, coalesce_s=self.coalesce_ms / 1000,
                       max_batch=self.coalesce_max, max_inflight=self.max_inflight, items="queries")


class SearchFormat(ActionFormat):
    """What both search formats share (module docstring); ``env`` is the retrieval service. A search format is built
    as ``cls(tokenizer, env, multi_turn section, data section)`` (``generation.search_agent``)."""

    row_type: ClassVar[type[Trajectory]] = SearchTrajectory

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env: SearchEnv) -> None:
        self.tokenizer = tokenizer
        self.env = env

    def services(self, calls: Calls) -> list[Service]:
        return [self.env.service()]

    def metrics(self, rows: list[SearchTrajectory]) -> dict[str, float]:
        n = max(len(rows), 1)
        return {
            "agent/searches_per_traj": sum(t.num_searches for t in rows) / n,
            "agent/truncated_obs": float(sum(t.truncated_obs for t in rows)),
            "agent/retrieval_wait_s": sum(t.env_wait_s for t in rows) / n,  # per trajectory
            # hermes: well-formed calls per trajectory, calls answered with an error, insertions that re-render
            # differently (0 in the tag format)
            "agent/tool_calls_per_traj": sum(t.num_tool_calls for t in rows) / n,
            "agent/invalid_calls": float(sum(t.num_invalid_calls for t in rows)),
            "agent/tokenization_mismatch": float(sum(t.tokenization_mismatch for t in rows)),
        }

    def columns(self, rows: list[SearchTrajectory]) -> dict[str, list]:
        return {"num_searches": [t.num_searches for t in rows], "queries": [list(t.queries) for t in rows]}
