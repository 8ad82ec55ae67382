"""The online search backend: ``/retrieve`` answered by a web search engine instead of a local index.

``python -m retrieval_server.serve --backend serpapi|google|serper|brave --api-key-env VAR [--search-url URL]``
serves an ``OnlineService``, which the app drives exactly like a local index's ``SearchService`` (same request and
answer, same passage format; ``engines.py`` turns each engine's JSON into passages).

Choices (engines are slow, rate-limited, paid and change their answers):
- **Cache first.** Every query is looked up in the disk cache (``response_cache.py``, keyed by engine, query and
  k) before the engine is asked; repeats inside one batch are asked once. Hit rate = queries answered without an
  engine request / queries asked, since the service started (``/health``, ``/stats`` and the summary line).
- **Budget.** ``--max-requests`` engine requests per service process (retries count: each one can be billed);
  cached answers need none, so a replay works with the budget spent. The request that would exceed it is not sent
  and the ``/retrieve`` is answered 503 with ``"retryable": false`` and a detail naming the budget: the trainer's
  client stops waiting at once and the trainer saves its last finished step and exits 3 (docs/design.md).
- **Backoff, timeout, rate.** A 429, a 5xx, a timeout (``--engine-timeout`` per request) or a connection error is
  retried up to ``--max-retries`` times after ``--backoff * 2**i`` seconds (at most 30 s; a 429's numeric
  ``Retry-After`` is honoured up to that cap); when retries run out the ``/retrieve`` is answered 503 (retryable):
  to the trainer an engine outage is a retrieval outage (its client backs off, then checkpoints and stops). At most
  ``--engine-concurrency`` requests are in flight and, with ``--max-rps``, they start at most that often.
- **Errors that waiting does not fix.** 401/403 (the key is refused) is answered 502 with ``"retryable": false``.
  Malformed JSON, an answer that is not the engine's documented shape, or another 4xx or a 3xx is answered 502
  (retryable; an engine glitch), naming the engine, the status and what was wrong. Redirects are not followed: a
  key sent as a header would go along to wherever they point.
- **The key.** Read from the environment variable named by ``--api-key-env`` (a clear error naming it when unset),
  held in memory only: never logged, never in ``/health``, never in the cache; every message built from an engine's
  answer or a transport error has the key replaced by ``***`` (SerpAPI and Google take it as a URL parameter).
- **No results.** An engine that finds nothing gets one passage saying so (id ``no-results``): Search-R1's client
  and ours treat an empty list as a broken service, and the policy should read "no results" as a search would.
- **Scores.** Engines give ranks, not scores: with ``return_scores`` a hit's score is ``1 / rank`` and its row its
  rank - 1 (no corpus rows here; an online backend is never a shard).
- **Cost.** ``--cost-per-request`` USD times the requests the engine answered 200 (what engines bill), in the
  summary line and ``/health``; requests sent (all attempts) are what the budget counts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from retrieval_server.search.online.engines import ENGINES, Engine, EngineError, error_text
from retrieval_server.search.online.response_cache import ResponseCache
from retrieval_server.search.service import BackendError, Hit

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
NO_RESULTS = {"id": "no-results", "contents": "\"No results\"\nThe search engine found no results for this query."}
DEFAULT_CACHE_DIR = "~/.cache/search_r1/online"


@dataclass(frozen=True)
class OnlineOptions:
    """How an online engine is used (``serve --backend ENGINE ...``); validated once, here."""

    engine: str  # one of ENGINES
    api_key_env: str  # name of the environment variable holding the key
    search_url: str | None = None  # the engine's endpoint; None = its public one
    google_cx: str | None = None  # Google Custom Search's search engine id (required for google)
    cache_dir: str = DEFAULT_CACHE_DIR
    max_requests: int = 1000  # engine requests this service may send (retries included)
    cost_per_request: float = 0.0  # USD per request the engine answered
    timeout_s: float = 10.0  # per engine request
    max_retries: int = 4  # after a 429 / 5xx / timeout / connection error
    backoff_s: float = 1.0  # first retry's wait; doubles each retry, at most MAX_BACKOFF_S
    concurrency: int = 4  # engine requests in flight at once
    max_rps: float = 0.0  # engine requests started per second at most; 0 = no limit

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"--backend must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.engine == "google" and not self.google_cx:
            raise ValueError("--backend google needs --google-cx ID, the Programmable Search Engine id (cx) to query")
        if self.engine != "google" and self.google_cx:
            raise ValueError(f"--google-cx is Google Custom Search's engine id; --backend {self.engine} takes none")
        for name, value, least in (("--max-requests", self.max_requests, 1), ("--max-retries", self.max_retries, 0),
                                   ("--engine-concurrency", self.concurrency, 1)):
            if value < least:
                raise ValueError(f"{name} must be at least {least}, got {value}")
        for name, value in (("--engine-timeout", self.timeout_s), ("--backoff", self.backoff_s),
                            ("--cost-per-request", self.cost_per_request), ("--max-rps", self.max_rps)):
            if not 0 <= value < float("inf") or (name == "--engine-timeout" and value == 0):
                raise ValueError(f"{name} must be a {'positive' if name == '--engine-timeout' else 'non-negative'} "
                                 f"finite number, got {value}")
        if self.search_url is not None and not self.search_url.startswith(("http://", "https://")):
            raise ValueError(f"--search-url must be an http:// or https:// URL, got {self.search_url!r}")

    @property
    def url(self) -> str:
        return self.search_url or ENGINES[self.engine].default_url

    @property
    def cache_engine(self) -> str:
        """The engine part of a cache key: its name, plus Google's cx (another cx is another search engine)."""
        return f"google:{self.google_cx}" if self.engine == "google" else self.engine


def read_api_key(env_name: str) -> str:
    """The key in ``$env_name``; ``ValueError`` naming the variable when it is unset or empty."""
    key = os.environ.get(env_name, "").strip()
    if not key:
        raise ValueError(f"environment variable {env_name} (named by --api-key-env) is not set: export it with the "
                         "engine's API key before starting the service")
    return key


@dataclass
class OnlineStats:
    """Counters since the service started (``/stats``, ``/health``, the summary line)."""

    queries: int = 0  # asked for, repeats included
    cache_hits: int = 0  # answered without an engine request (from the cache, or a repeat in the same batch)
    requests: int = 0  # sent to the engine, retries included (what the budget counts)
    answered: int = 0  # answered 200 with results (what engines bill)
    retries: int = 0  # requests re-sent after a 429 / 5xx / timeout / connection error
    failures: int = 0  # queries that got no answer (an error sent to the client)
    engine_s: float = 0.0  # seconds spent waiting for the engine's answers (all attempts)


class BudgetExhausted(BackendError):
    def __init__(self, message: str):
        super().__init__(503, message, retryable=False)


class OnlineService:
    """``search(queries, k)`` against an online engine, with the ``SearchService`` interface the app serves."""

    def __init__(self, options: OnlineOptions, api_key: str):
        self.options = options
        self.engine: Engine = ENGINES[options.engine]
        self._key = api_key
        self.cache = ResponseCache(Path(options.cache_dir).expanduser())
        self.counts = OnlineStats()
        self._lock = threading.Lock()  # counters, budget, pacing
        self._next_start = 0.0  # monotonic time the next request may start (--max-rps)
        self._pool = ThreadPoolExecutor(max_workers=options.concurrency, thread_name_prefix="engine")
        self._http = httpx.Client(timeout=options.timeout_s)  # no redirects: the key headers would follow them

    # -- the SearchService interface ------------------------------------------------------------------------------

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """The engine's top ``k`` per query as passages (cache first, misses fetched in parallel); raises
        ``BackendError`` when a miss cannot be answered (the other misses' answers are cached all the same)."""
        k = min(k, self.engine.max_count)
        answers: dict[str, list[dict]] = {}
        for query in dict.fromkeys(queries):
            cached = self.cache.get(self.options.cache_engine, query, k)
            if cached is not None:
                answers[query] = cached
        misses = [q for q in dict.fromkeys(queries) if q not in answers]
        with self._lock:
            self.counts.queries += len(queries)
            self.counts.cache_hits += len(queries) - len(misses)
        futures = {query: self._pool.submit(self._fetch, query, k) for query in misses}
        error: BackendError | None = None
        for query, future in futures.items():
            try:
                answers[query] = future.result()
            except BackendError as e:  # a reason that waiting cannot fix (the budget) wins
                error = e if error is None or (error.retryable and not e.retryable) else error
                with self._lock:
                    self.counts.failures += 1
        if error is not None:
            raise error
        return [[(json.dumps(p, ensure_ascii=False).encode(), 1.0 / (rank + 1), rank)
                 for rank, p in enumerate(answers[query][:k] or [NO_RESULTS])] for query in queries]

    def describe(self) -> dict:
        """What is served, for ``GET /health`` (the identity fields a client records, then the counters)."""
        counts = self.stats()
        return {"retriever": "online", "index": self.options.engine, "model": None, "corpus_sha256": None,
                "passages": None, "probe_sha256": None, "shard": None, "recall": None, "corpus_path": None,
                "index_path": None, "index_kind": "online",
                "search_url": self._redact(self.options.url), "google_cx": self.options.google_cx,
                "cache_dir": str(self.cache.path.parent), "max_requests": self.options.max_requests,
                "requests_left": self.options.max_requests - counts["requests"],
                "cost_per_request": self.options.cost_per_request, "engine_timeout_s": self.options.timeout_s,
                "max_retries": self.options.max_retries, **counts}

    def stats(self) -> dict:
        """The counters (``GET /stats``), the cache hit rate and the cost so far."""
        with self._lock:
            counts = asdict(self.counts)
        counts["cache_entries"] = len(self.cache)
        counts["cache_hit_rate"] = counts["cache_hits"] / counts["queries"] if counts["queries"] else None
        counts["cost_usd"] = counts["answered"] * self.options.cost_per_request
        return counts

    def summary(self) -> str:
        """One line of totals since the start: engine requests, cache hit rate, cost, budget left."""
        s = self.stats()
        rate = f"{100 * s['cache_hit_rate']:.1f}%" if s["cache_hit_rate"] is not None else "-"
        return (f"online {self.options.engine}: {s['requests']:,} engine requests ({s['answered']:,} answered, "
                f"{s['retries']:,} retries, {s['failures']:,} failed queries), cache {rate} hits "
                f"({s['cache_hits']:,} of {s['queries']:,} queries), cost ${s['cost_usd']:.4f} "
                f"(${self.options.cost_per_request:g}/request), budget {self.options.max_requests - s['requests']:,} "
                f"of {self.options.max_requests:,} requests left")

    def close(self) -> None:
        logger.info("%s (totals)", self.summary())
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()
        self.cache.close()

    # -- one query ------------------------------------------------------------------------------------------------

    def _fetch(self, query: str, k: int) -> list[dict]:
        """The engine's passages for ``query`` (retried per the module docstring), stored in the cache."""
        request = self.engine.request(self.options.url, query, k, self._key, self.options.google_cx)
        problem = ""
        for attempt in range(self.options.max_retries + 1):
            self._reserve()
            if attempt > 0:  # counted once sent (a retry the budget refused was never made)
                with self._lock:
                    self.counts.retries += 1
            start = time.monotonic()
            try:
                response = self._http.request(request.method, request.url, params=request.params or None,
                                              headers=request.headers, json=request.json)
            except httpx.TimeoutException:
                problem, retry_after = f"no answer within --engine-timeout {self.options.timeout_s:g} s", None
            except httpx.TransportError as e:
                problem, retry_after = self._redact(f"{type(e).__name__}: {e}"), None
            else:
                if response.status_code == 200:
                    passages = self._passages(response)
                    self.cache.put(self.options.cache_engine, query, k, passages, time.time())
                    return passages
                self._refuse_unless_transient(response)
                problem = self._redact(f"HTTP {response.status_code}: {error_text(response.content)}")
                retry_after = _retry_after_s(response)
            finally:
                with self._lock:
                    self.counts.engine_s += time.monotonic() - start
            if attempt < self.options.max_retries:
                delay = min(self.options.backoff_s * 2 ** attempt, MAX_BACKOFF_S)
                delay = min(max(delay, retry_after or 0.0), MAX_BACKOFF_S)
                logger.warning("%s: %s; retry %d of %d in %.2f s", self.options.engine, problem, attempt + 1,
                               self.options.max_retries, delay)
                time.sleep(delay)
        raise BackendError(503, f"{self.options.engine} at {self._redact(self.options.url)} did not answer after "
                                f"{self.options.max_retries + 1} attempts (--max-retries {self.options.max_retries}); "
                                f"last: {problem}")

    def _reserve(self) -> None:
        """Count one engine request against the budget (``BudgetExhausted`` when it is spent), then wait for its
        start slot under ``--max-rps``."""
        with self._lock:
            if self.counts.requests >= self.options.max_requests:
                raise BudgetExhausted(
                    f"online search budget exhausted: {self.counts.requests:,} of --max-requests "
                    f"{self.options.max_requests:,} requests to {self.options.engine} made; cached queries still "
                    "answer. Restart the service with a larger --max-requests (the cache keeps what was paid for) "
                    "and resume the run")
            self.counts.requests += 1
            wait = 0.0
            if self.options.max_rps > 0:
                now = time.monotonic()
                start = max(now, self._next_start)
                self._next_start = start + 1.0 / self.options.max_rps
                wait = start - now
        if wait > 0:
            time.sleep(wait)

    def _passages(self, response: httpx.Response) -> list[dict]:
        """The passages of a 200 answer; ``BackendError`` 502 naming what is wrong with it."""
        try:
            payload = response.json()
        except ValueError:
            raise BackendError(502, self._redact(f"{self.options.engine} answered malformed JSON (HTTP 200, "
                                                 f"{len(response.content)} bytes): "
                                                 f"{response.content[:120].decode('utf-8', 'replace')!r}")) from None
        try:
            results = self.engine.parse(payload)
        except EngineError as e:
            raise BackendError(502, self._redact(str(e))) from None
        with self._lock:
            self.counts.answered += 1
        return [result.passage() for result in results]

    def _refuse_unless_transient(self, response: httpx.Response) -> None:
        """Raise ``BackendError`` for an error status that a retry would not fix (anything but 429 and 5xx)."""
        status = response.status_code
        if status == 429 or status >= 500:
            return
        said = self._redact(error_text(response.content))
        if status in (401, 403):
            raise BackendError(502, f"{self.options.engine} refused the API key in ${self.options.api_key_env} "
                                    f"(HTTP {status}: {said}); check the key and the account", retryable=False)
        raise BackendError(502, f"{self.options.engine} rejected the request (HTTP {status}: {said})")

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***")


def _retry_after_s(response: httpx.Response) -> float | None:
    """A 429's ``Retry-After`` in seconds (the HTTP-date form is ignored)."""
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value)) if response.status_code == 429 and value else None
    except ValueError:
        return None


def add_online_args(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` flags of the online backend."""
    g = parser.add_argument_group("online search backend (--backend serpapi|google|serper|brave)")
    g.add_argument("--api-key-env", default=None,
                   help="name of the environment variable holding the engine's API key (never logged or written)")
    g.add_argument("--search-url", default=None,
                   help="the engine's endpoint (default: its public one; Search-R1's --search_url)")
    g.add_argument("--google-cx", default=None, help="--backend google: the Programmable Search Engine id (cx)")
    g.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR,
                   help="directory of the response cache (responses.sqlite), keyed by engine, query and topk: "
                        "repeats cost nothing and a run replays with the engine stopped")
    g.add_argument("--max-requests", type=int, default=OnlineOptions.max_requests,
                   help="budget: engine requests this service may send, retries included; then /retrieve answers "
                        "503 naming it (cached queries still answer)")
    g.add_argument("--cost-per-request", type=float, default=0.0, help="USD per answered engine request")
    g.add_argument("--engine-timeout", type=float, default=OnlineOptions.timeout_s,
                   help="seconds one engine request may take")
    g.add_argument("--max-retries", type=int, default=OnlineOptions.max_retries,
                   help="retries of a request answered 429/5xx, timed out or failed to connect")
    g.add_argument("--backoff", type=float, default=OnlineOptions.backoff_s,
                   help=f"seconds before the first retry, doubling each retry (at most {MAX_BACKOFF_S:g})")
    g.add_argument("--engine-concurrency", type=int, default=OnlineOptions.concurrency,
                   help="engine requests in flight at once")
    g.add_argument("--max-rps", type=float, default=0.0, help="engine requests started per second at most (0: no "
                                                               "limit)")


def online_options(args: argparse.Namespace) -> OnlineOptions:
    """``OnlineOptions`` from ``serve``'s parsed flags; ``ValueError`` naming the bad flag."""
    if not args.api_key_env:
        raise ValueError(f"--backend {args.backend} needs --api-key-env VAR, the environment variable holding its "
                         "API key")
    return OnlineOptions(engine=args.backend, api_key_env=args.api_key_env, search_url=args.search_url,
                         google_cx=args.google_cx, cache_dir=args.cache_dir, max_requests=args.max_requests,
                         cost_per_request=args.cost_per_request, timeout_s=args.engine_timeout,
                         max_retries=args.max_retries, backoff_s=args.backoff, concurrency=args.engine_concurrency,
                         max_rps=args.max_rps)
