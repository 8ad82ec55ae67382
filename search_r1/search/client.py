"""Client of the retrieval service (``retrieval_server``), used by the multi-turn agent loop.

Choices:
- One persistent ``httpx.Client`` (keep-alive connection reused across turns).
- One ``POST /retrieve`` per call for all queries of the batch (the server batches them together),
  split into requests of at most ``max_batch`` queries so a large rollout never exceeds the
  server's per-request limit (``--max-queries``, default 1024).
- Transient failures (connection errors, timeouts, 5xx, including 503 while the index loads) are
  retried with exponential backoff, ``backoff * 2**i`` seconds before retry ``i + 1`` but at most
  ``max_backoff``, each wait logged, for as long as the service has been failing less than
  ``outage_timeout_s`` seconds (a last attempt is made at that deadline). A service that comes back
  within it costs only time: the caller gets real results, never an empty list in their place. One
  that does not raises ``RetrievalUnavailable``, which the trainer treats as an outage of the task's
  environment (``verl.trainer.recipe.EnvironmentUnavailable``: save a checkpoint, stop). A 4xx means
  the request itself is wrong and is raised at once. Every error names the URL.
- ``check_health`` (before a run) raises ``RetrievalUnavailable`` too when the service does not answer:
  an ``EnvironmentUnavailable`` raised while the trainer is being built is a wrong or unstarted
  ``retriever.url`` (exit 2), one raised during training an outage (exit 3).
"""

from __future__ import annotations

import logging
import time

import httpx

from verl.trainer.recipe import EnvironmentUnavailable

logger = logging.getLogger(__name__)

LAUNCH_HINT = "start it with retrieval_launch.sh"


class RetrievalError(RuntimeError):
    """The retrieval service could not answer; the message always names the URL."""


class RetrievalUnavailable(RetrievalError, EnvironmentUnavailable):
    """The service did not answer: at start-up within ``check_health``'s wait, or during a run for longer than
    ``outage_timeout_s``."""


class RetrievalClient:
    """Batched search against ``<url>/retrieve``; ``topk`` passages per query."""

    def __init__(self, url: str, topk: int, timeout: float = 30.0, outage_timeout_s: float = 300.0,
                 backoff: float = 0.5, max_backoff: float = 8.0, max_batch: int = 512):
        if topk < 1:
            raise ValueError(f"topk must be at least 1, got {topk}")
        if outage_timeout_s < 0:
            raise ValueError(f"outage_timeout_s must be >= 0, got {outage_timeout_s}")
        self.url = url.rstrip("/")
        self.topk = topk
        self.outage_timeout_s = outage_timeout_s
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_batch = max_batch
        self._http = httpx.Client(timeout=timeout)

    def search(self, queries: list[str]) -> list[list[dict]]:
        """One POST /retrieve for all queries; per query `topk` docs as {"id": str, "contents": str}.

        Retries with exponential backoff on connection errors, timeouts and 5xx; 4xx -> RetrievalError at once;
        failing for outage_timeout_s -> RetrievalUnavailable naming the URL and saying to start it with
        retrieval_launch.sh.
        """
        results: list[list[dict]] = []
        for start in range(0, len(queries), self.max_batch):
            results.extend(self._post(queries[start:start + self.max_batch]))
        return results

    def _post(self, queries: list[str]) -> list[list[dict]]:
        """One request, retried while the service has been failing for less than ``outage_timeout_s``."""
        endpoint = self.url + "/retrieve"
        payload = {"queries": queries, "topk": self.topk, "return_scores": False}
        first_failure, retry = None, 0
        while True:
            try:
                response = self._http.post(endpoint, json=payload)
            except httpx.TransportError as e:  # connection refused/reset, timeouts
                problem = f"{type(e).__name__}: {e}"
            else:
                if response.status_code == 200:
                    return self._parse(response, endpoint, len(queries))
                if response.status_code < 500:
                    raise RetrievalError(f"retrieval service at {endpoint} rejected the request "
                                         f"(HTTP {response.status_code}): {_detail(response)}")
                problem = f"HTTP {response.status_code}: {_detail(response)}"
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            down = now - first_failure
            if down >= self.outage_timeout_s:
                raise RetrievalUnavailable(
                    f"retrieval service at {endpoint} failed for {down:.1f}s, {retry + 1} attempts "
                    f"(retriever.outage_timeout_s={self.outage_timeout_s:g}; last error: {problem}); "
                    f"is it running? {LAUNCH_HINT}")
            delay = min(self.backoff * 2 ** retry, self.max_backoff, self.outage_timeout_s - down)
            logger.warning("retrieval at %s failed (%s); retry %d in %.2fs (failing for %.1fs of "
                           "retriever.outage_timeout_s=%gs)", endpoint, problem, retry + 1, delay, down,
                           self.outage_timeout_s)
            time.sleep(delay)
            retry += 1

    @staticmethod
    def _parse(response: httpx.Response, endpoint: str, n_queries: int) -> list[list[dict]]:
        try:
            result = response.json()["result"]
        except (ValueError, KeyError, TypeError):
            raise RetrievalError(f"retrieval service at {endpoint} sent a malformed answer: "
                                 f"{response.text[:200]!r}") from None
        if not isinstance(result, list) or len(result) != n_queries:
            raise RetrievalError(f"retrieval service at {endpoint} answered {len(result)} result lists "
                                 f"for {n_queries} queries")
        empty = [i for i, docs in enumerate(result) if not docs]
        if empty:  # never let an empty <information> block pass for a search result
            raise RetrievalError(f"retrieval service at {endpoint} answered no passages for query {empty[0]} "
                                 f"of {n_queries}")
        return [[{"id": doc["id"], "contents": doc["contents"]} for doc in docs] for docs in result]

    def check_health(self, wait_s: float = 0.0) -> None:
        """GET /health, polling up to wait_s seconds; raise RetrievalUnavailable('... not answering at URL; start it
        with retrieval_launch.sh', or '... still loading its index') if it never answers 200."""
        endpoint = self.url + "/health"
        deadline = time.monotonic() + wait_s
        last = "no answer"
        while True:
            try:
                response = self._http.get(endpoint)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}: {_detail(response)}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
        if last.startswith("HTTP 503") and "loading" in last:
            raise RetrievalUnavailable(f"retrieval service at {self.url} is still loading its index after "
                                       f"{wait_s:.0f}s ({last}); wait longer")
        raise RetrievalUnavailable(f"retrieval service not answering at {self.url} ({last}); {LAUNCH_HINT}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _detail(response: httpx.Response) -> str:
    """The server's ``detail`` message when it sent one, else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:200]
