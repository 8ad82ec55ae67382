"""What each online search engine is asked and what its documented JSON answer holds.

Choices:
- One ``Engine`` per service, a plain description: its public endpoint (``serve --search-url`` replaces it, e.g. with
  a proxy or a loopback test engine), the most results one request may ask for, how the request is made and where
  the organic results sit in the answer:

  ========  ===========================================  =================================  ======================
  engine    endpoint (GET unless said)                   results                            key goes in
  ========  ===========================================  =================================  ======================
  serpapi   https://serpapi.com/search.json              organic_results[].title/snippet/    ``api_key`` parameter
            (``engine=google``, ``q``, ``num``)           link
  google    https://www.googleapis.com/customsearch/v1   items[].title/snippet/link          ``key`` parameter
            (``cx``, ``q``, ``num`` <= 10)
  serper    POST https://google.serper.dev/search        organic[].title/snippet/link        ``X-API-KEY`` header
            (JSON ``{"q", "num"}``)
  brave     https://api.search.brave.com/res/v1/web/     web.results[].title/description/    ``X-Subscription-Token``
            search (``q``, ``count`` <= 20)               url                                header
  ========  ===========================================  =================================  ======================

- An answer without its results list is an empty result only where the engine documents it so (Google leaves
  ``items`` out, Serper/Brave send an empty list, SerpAPI sends ``organic_results_state: "Fully empty"`` or an
  ``error`` with ``search_metadata.status`` ``Success``); an ``error`` object or message is an ``EngineError`` with
  the engine's own words; anything else (a list where an object belongs, a result without a title) is an
  ``EngineError`` naming the field.
- Titles and snippets are plain text: HTML tags (Brave marks matches with ``<strong>``) are dropped and entities
  unescaped, so a snippet can never carry markup (or an agent's tags) into the ``<information>`` block.
- Each result becomes a passage in Search-R1's corpus format, ``{"id": link, "contents": "\\"Title\\"\\nsnippet"}``:
  the id is the page's URL (stable across runs, and what a page-opening tool would fetch).
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field


class EngineError(RuntimeError):
    """The engine answered, but not with results: its error message, or an answer that is not its documented JSON."""


@dataclass(frozen=True)
class Result:
    title: str
    snippet: str
    link: str

    def passage(self) -> dict:
        """Search-R1's corpus row for this result."""
        return {"id": self.link, "contents": f'"{self.title}"\n{self.snippet}'}


@dataclass(frozen=True)
class Request:
    """One HTTP request to an engine; ``params`` and ``headers`` may hold the API key (never log them)."""

    method: str
    url: str
    params: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    json: dict | None = None


@dataclass(frozen=True)
class Engine:
    name: str
    default_url: str
    max_count: int  # most results one request may ask for
    results_path: tuple[str, ...]  # keys leading to the results list
    snippet_key: str
    link_key: str

    def request(self, url: str, query: str, k: int, key: str, cx: str | None = None) -> Request:
        """The request for the top ``k`` results of ``query`` (``cx``: Google's search engine id)."""
        if self.name == "serpapi":
            return Request("GET", url, {"engine": "google", "q": query, "num": k, "api_key": key})
        if self.name == "google":
            return Request("GET", url, {"key": key, "cx": cx, "q": query, "num": k})
        if self.name == "serper":
            return Request("POST", url, headers={"X-API-KEY": key}, json={"q": query, "num": k})
        return Request("GET", url, {"q": query, "count": k},
                       headers={"X-Subscription-Token": key, "Accept": "application/json"})

    def parse(self, payload: object) -> list[Result]:
        """The organic results of a decoded 200 answer, in the engine's order; ``EngineError`` otherwise."""
        if not isinstance(payload, dict):
            raise EngineError(f"{self.name} answered a JSON {type(payload).__name__}, not an object")
        error = _error_message(payload)
        node: object = payload
        for depth, step in enumerate(self.results_path):
            if not isinstance(node, dict):
                where = ".".join(self.results_path[:depth])
                raise EngineError(f"{self.name} answered {where} as a {type(node).__name__}, not an object")
            if step not in node:
                if error is not None and not self._empty_answer(payload):
                    raise EngineError(f"{self.name} answered an error: {error}")
                return []  # the engine found nothing (module docstring)
            node = node[step]
        field_name = ".".join(self.results_path)
        if not isinstance(node, list):
            raise EngineError(f"{self.name} answered {field_name} as a {type(node).__name__}, not a list")
        return [self._result(item, f"{field_name}[{i}]") for i, item in enumerate(node)]

    def _empty_answer(self, payload: dict) -> bool:
        """SerpAPI's documented no-results answer: a Success status (or a "Fully empty" state) with an error text."""
        if self.name != "serpapi":
            return False
        metadata, information = payload.get("search_metadata"), payload.get("search_information")
        return (isinstance(metadata, dict) and metadata.get("status") == "Success") or \
            (isinstance(information, dict) and information.get("organic_results_state") == "Fully empty")

    def _result(self, item: object, where: str) -> Result:
        if not isinstance(item, dict):
            raise EngineError(f"{self.name} answered {where} as a {type(item).__name__}, not an object")
        values = []
        for key in ("title", self.snippet_key, self.link_key):
            value = item.get(key, "" if key == self.snippet_key else None)  # a result may come without a snippet
            if not isinstance(value, str):
                raise EngineError(f"{self.name} answered {where}.{key} as {json.dumps(value)[:60]}, not a string")
            values.append(value)
        title, snippet, link = values
        return Result(plain_text(title), plain_text(snippet), link)


ENGINES: dict[str, Engine] = {engine.name: engine for engine in (
    Engine("serpapi", "https://serpapi.com/search.json", 100, ("organic_results",), "snippet", "link"),
    Engine("google", "https://www.googleapis.com/customsearch/v1", 10, ("items",), "snippet", "link"),
    Engine("serper", "https://google.serper.dev/search", 100, ("organic",), "snippet", "link"),
    Engine("brave", "https://api.search.brave.com/res/v1/web/search", 20, ("web", "results"), "description", "url"),
)}


def _error_message(payload: dict) -> str | None:
    """The engine's error text: SerpAPI and Serper send ``"error": str`` (Serper also ``"message"``), Google
    ``"error": {"code", "message"}``, Brave ``"error": {"code", "detail"}``."""
    error = payload.get("error")
    if isinstance(error, dict):
        parts = [str(error[key]) for key in ("code", "status", "message", "detail") if key in error]
        return ": ".join(parts) or json.dumps(error)[:200]
    if error is not None:
        return str(error)
    if isinstance(payload.get("message"), str):
        return payload["message"]
    return None


def error_text(body: bytes) -> str:
    """What an engine said in an error answer (its error message, else the start of the body)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    message = _error_message(payload) if isinstance(payload, dict) else None
    return message if message is not None else json.dumps(payload)[:200]


_TAG = re.compile(r"<[^>]*>")


def plain_text(text: str) -> str:
    """``text`` without HTML tags and entities, whitespace runs collapsed."""
    return " ".join(html.unescape(_TAG.sub("", text)).split())
