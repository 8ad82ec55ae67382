"""The search recipe's tools for the hermes action format (``verl.tools``): ``search`` and ``open``.

- ``SearchTool``: the retrieval service, as the tag format's ``<search>``; all queries of a turn (of all rows, in
  lockstep) go out in one ``/retrieve`` request, through the loop's schedule (its coalescer in async mode). Each
  passage is shown with its corpus id, so the policy can ``open`` it.
- ``OpenTool``: a whole document by id, from the service's ``POST /doc`` (``RetrievalClient.documents``: with several
  endpoints or ``ray://NAME``, a replica of the index); an unknown id gets an error message naming it. The loop cuts
  a long page to ``multi_turn.max_tool_response_length`` tokens, with a notice.

Importing this module registers both (``verl.tools.register_tool``); ``search_r1.recipe`` imports it.
``DEFAULT_TOOLS`` is what a run offers when ``multi_turn.tool_config_path`` is null: ``search`` alone, the tag
format's one action.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search_r1.llm_agent.formatting import split_title
from verl.tools import Tool, ToolCallError, ToolSpec, register_tool

if TYPE_CHECKING:
    from search_r1.search.client import RetrievalClient

SEARCH_SCHEMA = {"type": "function", "function": {
    "name": "search",
    "description": "Search the knowledge base. Returns the top passages for the query, each with its id.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look up"}},
                   "required": ["query"]}}}
OPEN_SCHEMA = {"type": "function", "function": {
    "name": "open",
    "description": "Read a whole document, given its id as search results show it.",
    "parameters": {"type": "object", "properties": {"id": {"type": "string", "description": "the document id"}},
                   "required": ["id"]}}}
DEFAULT_TOOLS = [ToolSpec("SearchTool", {}, SEARCH_SCHEMA)]


@dataclass
class ToolEnv:
    """What the search loop shares with its tools."""

    retrieve: Callable[[list[str]], Awaitable[list[list[dict]]]]  # queries -> passages, through the loop's schedule
    client: RetrievalClient | None  # None when do_search=false
    do_search: bool


def format_hits(docs: list[dict]) -> str:
    """Passages as the search tool shows them: 'Doc 1 (id: ID, Title: T) text', one per line."""
    if not docs:
        return "No results."
    lines = []
    for i, doc in enumerate(docs, start=1):
        title, text = split_title(doc["contents"])
        lines.append(f"Doc {i} (id: {doc['id']}, Title: {title}) {text}")
    return "\n".join(lines)


@register_tool
class SearchTool(Tool):
    """The retrieval service (module docstring)."""

    def setup(self, env: ToolEnv) -> None:
        self.env = env

    async def call(self, arguments: dict[str, Any]) -> str:
        return (await self.call_many([arguments]))[0]

    async def call_many(self, arguments: list[dict[str, Any]]) -> list[str | ToolCallError]:
        queries = [a["query"].strip() for a in arguments]
        empty = [i for i, q in enumerate(queries) if not q]
        asked = [q for q in queries if q]
        docs = (await self.env.retrieve(asked) if self.env.do_search else [[] for _ in asked]) if asked else []
        found = iter(docs)
        return [ToolCallError("the query is empty; write what to look up") if i in empty else format_hits(next(found))
                for i in range(len(queries))]


@register_tool
class OpenTool(Tool):
    """A whole document by id (module docstring)."""

    def setup(self, env: ToolEnv) -> None:
        if env.client is None:
            raise ValueError("the open tool needs the retrieval service (do_search=true and retriever.url)")
        self.client = env.client

    async def call(self, arguments: dict[str, Any]) -> str:
        return (await self.call_many([arguments]))[0]

    async def call_many(self, arguments: list[dict[str, Any]]) -> list[str | ToolCallError]:
        docs = await asyncio.to_thread(self.client.documents, [a["id"] for a in arguments])
        return [ToolCallError(f"no document has the id {a['id']!r}; use an id a search result shows")
                if doc is None else doc["contents"] for a, doc in zip(arguments, docs, strict=True)]
