"""The search loop in tests: its settings by short names, written into a ``SearchConfig`` (the loop reads the typed
config's sections, ``search_r1.llm_agent.generation.search_agent``), and the loop built from it."""

from __future__ import annotations

from search_r1.config import SearchConfig
from search_r1.llm_agent.generation import AgentLoop, search_agent

# short name -> config key
KEYS = {
    "max_turns": "max_turns", "do_search": "do_search", "topk": "retriever.topk",
    "max_start_length": "data.max_start_length", "max_prompt_length": "data.max_prompt_length",
    "max_response_length": "data.max_response_length", "max_obs_length": "data.max_obs_length",
    "max_trajectory_length": "data.max_trajectory_length",
    "mode": "actor_rollout_ref.rollout.mode", "chunk_tokens": "actor_rollout_ref.rollout.async_chunk_tokens",
    "coalesce_ms": "retriever.coalesce_ms", "coalesce_max": "retriever.coalesce_max",
    "max_inflight_searches": "retriever.max_inflight",
    "format": "actor_rollout_ref.rollout.multi_turn.format",
    "tool_config_path": "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    "max_tool_response_length": "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "max_parallel_calls": "actor_rollout_ref.rollout.multi_turn.max_parallel_calls",
}


def search_config(**settings) -> SearchConfig:
    """A ``SearchConfig`` of the defaults with ``settings`` (short names of ``KEYS``) set."""
    cfg = SearchConfig()
    for name, value in settings.items():
        *parents, last = KEYS[name].split(".")
        node = cfg
        for part in parents:
            node = getattr(node, part)
        setattr(node, last, value)
    return cfg


def make_agent(tokenizer, engine, client, cfg: SearchConfig) -> AgentLoop:
    """The search loop over ``engine`` and ``client`` (None: no service) with ``cfg``'s settings."""
    return search_agent(cfg, tokenizer, engine, client)
