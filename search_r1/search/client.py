"""Client of the retrieval service (``retrieval_server``), used by the multi-turn agent loop.

Choices:
- One persistent ``httpx.Client`` (keep-alive connection reused across turns), shared by the threads
  of the asynchronous rollout (httpx's client is thread-safe, so is the replica state).
- One ``POST /retrieve`` per call for all queries of the batch (the server batches them together),
  split into requests of at most ``max_batch`` queries so a large rollout never exceeds the
  server's per-request limit (``--max-queries``, default 1024).
- Transient failures (connection errors, timeouts, 5xx, including 503 while the index loads) are
  retried with exponential backoff, ``backoff * 2**i`` seconds before retry ``i + 1`` but at most
  ``max_backoff``, each wait logged, for as long as the service has been failing less than
  ``outage_timeout_s`` seconds (a last attempt is made at that deadline). A service that comes back
  within it costs only time: the caller gets real results, never an empty list in their place. One
  that does not (or a 5xx whose body says ``"retryable": false``: an online backend's spent budget, at once)
  raises ``RetrievalUnavailable``, which the trainer treats as an outage of the task's
  environment (``verl.trainer.recipe.EnvironmentUnavailable``: save a checkpoint, stop). A 4xx means
  the request itself is wrong and is raised at once. Every error names the URL.
- ``check_health`` (before a run) raises ``RetrievalUnavailable`` too when the service does not answer:
  an ``EnvironmentUnavailable`` raised while the trainer is being built is a wrong or unstarted
  ``retriever.url`` (exit 2), one raised during training an outage (exit 3).
- Several endpoints (``retriever.url`` = ``URL,URL,...`` or ``ray://NAME``; ``endpoints.py``): the
  client groups them into shards and replicas from their ``/health``, sends each search to every
  shard in parallel (asking for scores and corpus rows) and merges the answers into the top ``topk``
  of the whole index. Each request goes to the replica with the fewest requests in flight; a replica
  that fails, or takes longer than ``replica_timeout_s`` while another replica is left to try, is
  marked down for ``replica_cooldown_s`` and the request goes at once to another replica (logged).
  Only when every replica of a shard has failed does the backoff above apply (with ``ray://``, the
  endpoints are looked up again before each retry: restarted replicas listen on new ports). Whole documents
  (``POST /doc``, the hermes format's ``open`` tool) go the same way to a replica of any shard, since each shard
  server serves the whole corpus file. One URL sends exactly the requests it always did.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from search_r1.search.endpoints import (
    EndpointLookupError,
    EndpointSetError,
    Served,
    Shard,
    group_replicas,
    merge_hits,
    resolve_urls,
    split_urls,
)
from verl.trainer.recipe import EnvironmentUnavailable

logger = logging.getLogger(__name__)

LAUNCH_HINT = "start it with retrieval_launch.sh"


class RetrievalError(RuntimeError):
    """The retrieval service could not answer; the message always names the URL."""


class RetrievalUnavailable(RetrievalError, EnvironmentUnavailable):
    """The service did not answer: at start-up within ``check_health``'s wait, or during a run for longer than
    ``outage_timeout_s``."""


class RetrievalClient:
    """Batched search against ``<url>/retrieve`` (or the shards and replicas of a comma-separated ``url``); ``topk``
    passages per query."""

    def __init__(self, url: str, topk: int, timeout: float = 30.0, outage_timeout_s: float = 300.0,
                 backoff: float = 0.5, max_backoff: float = 8.0, max_batch: int = 512,
                 replica_timeout_s: float = 10.0, replica_cooldown_s: float = 30.0, ray_timeout_s: float = 30.0):
        if topk < 1:
            raise ValueError(f"topk must be at least 1, got {topk}")
        if outage_timeout_s < 0:
            raise ValueError(f"outage_timeout_s must be >= 0, got {outage_timeout_s}")
        self.urls = split_urls(url)
        if not self.urls:
            raise ValueError("url names no endpoint")
        self.url = self.urls[0] if len(self.urls) == 1 else ",".join(self.urls)
        self.topk = topk
        self.timeout = timeout
        self.outage_timeout_s = outage_timeout_s
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_batch = max_batch
        self.replica_timeout_s = replica_timeout_s
        self.replica_cooldown_s = replica_cooldown_s
        self.ray_timeout_s = ray_timeout_s  # ray://NAME: joining the cluster gives up after this long
        self.several = len(self.urls) > 1 or self.urls[0].startswith("ray://")
        self._http = httpx.Client(timeout=timeout)
        self._shards: list[Shard] | None = None  # several endpoints: found by check_health (or the first search)
        self._shards_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # fans a search out to the shards

    @classmethod
    def from_config(cls, retriever, ray_timeout_s: float = 30.0) -> RetrievalClient:
        """The client ``retriever`` (``search_r1.config.RetrieverConfig``) describes; ``ray_timeout_s``:
        ``trainer.ray_timeout_s``."""
        return cls(retriever.url, retriever.topk, timeout=retriever.timeout,
                   outage_timeout_s=retriever.outage_timeout_s, replica_timeout_s=retriever.replica_timeout_s,
                   replica_cooldown_s=retriever.replica_cooldown_s, ray_timeout_s=ray_timeout_s)

    def search(self, queries: list[str]) -> list[list[dict]]:
        """One POST /retrieve for all queries; per query `topk` docs as {"id": str, "contents": str}.

        Retries with exponential backoff on connection errors, timeouts and 5xx; 4xx -> RetrievalError at once;
        failing for outage_timeout_s -> RetrievalUnavailable naming the URL and saying to start it with
        retrieval_launch.sh.
        """
        post = self._post_shards if self.several else self._post
        results: list[list[dict]] = []
        for start in range(0, len(queries), self.max_batch):
            results.extend(post(queries[start:start + self.max_batch]))
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
                    return [[{"id": doc["id"], "contents": doc["contents"]} for doc in docs]
                            for docs in self._parse(response, endpoint, len(queries))]
                if response.status_code < 500:
                    raise _rejected(endpoint, response)
                problem = f"HTTP {response.status_code}: {_detail(response)}"
                if _final(response):
                    raise RetrievalUnavailable(f"retrieval service at {endpoint} cannot answer, and says waiting will "
                                               f"not help ({problem})")
            first_failure = self._wait_or_give_up(endpoint, problem, first_failure, retry)
            retry += 1

    def documents(self, ids: list[str]) -> list[dict | None]:
        """Whole documents by corpus id (``POST /doc``) -> per id ``{"id", "contents"}``, or None for an id the corpus
        does not have; a service that holds no documents (an online engine) is a ``RetrievalError`` naming it. Several
        endpoints (``ray://NAME`` included): a replica of any shard answers, as every shard server serves the whole
        corpus file, picked and failed over as for ``/retrieve``. Retried as ``search``."""
        found: dict[str, dict | None] = {}
        first_failure, retry = None, 0
        while todo := [i for i in dict.fromkeys(ids) if i not in found]:
            response, endpoint, problem = self._post_doc({"ids": todo})
            if response is not None:
                body = response.json() if response.headers.get("content-type", "").startswith("application/json") \
                    else {}
                if response.status_code == 200:
                    found.update({doc["id"]: doc for doc in body["docs"]})
                    continue
                if response.status_code == 404 and body.get("id") in todo:  # the first unknown id is named
                    found[body["id"]] = None
                    continue
                raise _rejected(endpoint, response)
            first_failure = self._wait_or_give_up(endpoint, problem, first_failure, retry)
            retry += 1
        return [found[i] for i in ids]

    def _post_doc(self, payload: dict) -> tuple[httpx.Response | None, str, str]:
        """One ``POST /doc``: (an answer below 500, its URL, "") or (None, where, the problem). Every replica gets the
        full ``timeout``: a service's first ``/doc`` builds its id map (``retrieval_server/search/documents.py``)."""
        if not self.several:
            endpoint = self.url + "/doc"
            try:
                response = self._http.post(endpoint, json=payload)
            except httpx.TransportError as e:
                return None, endpoint, f"{type(e).__name__}: {e}"
            if response.status_code >= 500:
                return None, endpoint, f"HTTP {response.status_code}: {_detail(response)}"
            return response, endpoint, ""
        shards = self._layout()
        problems = []
        for shard in shards:
            response, url, problem = self._send(shard, "/doc", payload, self.timeout)
            if response is not None:
                return response, url + "/doc", ""
            problems.append(problem)
        if any(url.startswith("ray://") for url in self.urls):
            self._refresh(shards)
        return None, f"{self.url} (every replica, /doc)", "; ".join(problems)

    def _wait_or_give_up(self, where: str, problem: str, first_failure: float | None, retry: int) -> float:
        """After failed attempt ``retry``: wait before the next one, or raise ``RetrievalUnavailable`` once the service
        has been failing for ``outage_timeout_s``. Returns when the failures began."""
        now = time.monotonic()
        first_failure = now if first_failure is None else first_failure
        down = now - first_failure
        if down >= self.outage_timeout_s:
            raise RetrievalUnavailable(
                f"retrieval service at {where} failed for {down:.1f}s, {retry + 1} attempts "
                f"(retriever.outage_timeout_s={self.outage_timeout_s:g}; last error: {problem}); "
                f"is it running? {LAUNCH_HINT}")
        delay = min(self.backoff * 2 ** retry, self.max_backoff, self.outage_timeout_s - down)
        logger.warning("retrieval at %s failed (%s); retry %d in %.2fs (failing for %.1fs of "
                       "retriever.outage_timeout_s=%gs)", where, problem, retry + 1, delay, down,
                       self.outage_timeout_s)
        time.sleep(delay)
        return first_failure

    def _post_shards(self, queries: list[str]) -> list[list[dict]]:
        """Every shard's top ``topk`` (in parallel), merged into the whole index's."""
        n_shards = len(self._layout())
        if n_shards == 1:
            return merge_hits([self._post_shard(0, queries)], self.topk)
        futures = [self._pool.submit(self._post_shard, i, queries) for i in range(n_shards)]
        return merge_hits([future.result() for future in futures], self.topk)

    def _post_shard(self, index: int, queries: list[str]) -> list[list[dict]]:
        """Shard ``index``'s hits (``{"document", "score", "row"}``) per query, from one of its replicas; every
        replica failing is an outage of the shard (backoff, then ``RetrievalUnavailable``)."""
        payload = {"queries": queries, "topk": self.topk, "return_scores": True, "return_rows": True}
        first_failure, retry = None, 0
        while True:
            shards = self._layout()
            shard = shards[index]
            response, url, problem = self._send(shard, "/retrieve", payload, self.replica_timeout_s)
            if response is not None:
                if response.status_code != 200:
                    raise _rejected(url + "/retrieve", response)
                return self._parse(response, url + "/retrieve", len(queries))
            where = f"{', '.join(url + '/retrieve' for url in shard.urls)} (every replica of {shard.name()})"
            first_failure = self._wait_or_give_up(where, problem, first_failure, retry)
            retry += 1
            if any(url.startswith("ray://") for url in self.urls):
                self._refresh(shards)

    def _send(self, shard: Shard, path: str, payload: dict,
              failover_timeout: float) -> tuple[httpx.Response | None, str, str]:
        """POST ``payload`` to ``path`` of the replicas of ``shard`` in turn until one answers below 500: (its answer,
        its URL, "") or (None, "", the problems of all). A replica slower than ``failover_timeout`` is abandoned while
        another is left to try; the last one gets the full ``timeout``."""
        tried: set[str] = set()
        problems = []
        include_down = shard.all_down()  # down replicas are tried again only when none is up
        while (picked := shard.acquire(tried, include_down)) is not None:
            url, others_left = picked
            tried.add(url)
            ok = False
            try:
                response = self._http.post(url + path, json=payload,
                                           timeout=failover_timeout if others_left else self.timeout)
            except httpx.TransportError as e:
                problem = f"{type(e).__name__}: {e}"
            else:
                ok = response.status_code < 500
                problem = f"HTTP {response.status_code}: {_detail(response)}"
            finally:
                shard.release(url, ok)
            if ok:
                return response, url, ""
            problems.append(f"{url}: {problem}")
            if others_left:
                logger.warning("retrieval replica %s of %s failed (%s); down for %gs (retriever.replica_cooldown_s), "
                               "request sent to another replica", url, shard.name(), problem, shard.cooldown_s)
        return None, "", "; ".join(problems) or "no replica"

    def _layout(self) -> list[Shard]:
        """The shards (with their replicas) of several endpoints, found on first use."""
        if self._shards is None:
            with self._shards_lock:
                if self._shards is None:
                    self._set_layout(self._discover(wait_s=0.0, require_all=True))
        return self._shards

    def _set_layout(self, shards: list[Shard]) -> None:
        if self._pool is None and len(shards) > 1:
            self._pool = ThreadPoolExecutor(max_workers=min(32, 8 * len(shards)), thread_name_prefix="retrieval")
        self._shards = shards

    def _refresh(self, seen: list[Shard]) -> None:
        """Look the ``ray://`` endpoints up again (once for all threads that saw ``seen`` fail); keep the old layout
        if the new endpoints do not form the index yet."""
        with self._shards_lock:
            if self._shards is not seen:
                return
            try:
                self._set_layout(self._discover(wait_s=0.0, require_all=False))
            except RetrievalError as e:
                logger.warning("looking up the retrieval endpoints again: %s", e)

    def _discover(self, wait_s: float, require_all: bool) -> list[Shard]:
        """GET /health of every endpoint (polling up to ``wait_s``) and group them into shards; ``RetrievalError``
        when they do not form one index, ``RetrievalUnavailable`` when some do not answer (``require_all``) or a
        shard has no replica that answers."""
        try:
            urls = resolve_urls(self.urls, self.ray_timeout_s)
        except EndpointLookupError as e:
            raise RetrievalUnavailable(f"retriever.url={self.url}: {e}") from None
        if not urls:
            raise RetrievalUnavailable(f"no retrieval endpoints found for {self.url}; {LAUNCH_HINT}")
        deadline = time.monotonic() + wait_s
        served: dict[str, Served] = {}
        problems: dict[str, str] = {}
        while True:
            for url in urls:
                if url not in served:
                    body, problems[url] = self._health(url)
                    if body is not None:
                        _require_ours(url, body)
                        served[url] = Served.from_health(url, body)
                        del problems[url]
            if not problems or time.monotonic() >= deadline:
                break
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
        if problems and (require_all or not served):
            listed = "; ".join(f"{url} ({problem})" for url, problem in problems.items())
            raise RetrievalUnavailable(f"retrieval service not answering at {listed}; {LAUNCH_HINT}")
        try:
            groups = group_replicas(list(served.values()))
        except EndpointSetError as e:
            raise RetrievalError(f"retriever.url={self.url}: {e}") from None
        return [Shard(i, len(groups), urls, self.replica_cooldown_s) for i, urls in enumerate(groups)]

    def _health(self, url: str) -> tuple[dict | None, str]:
        """``GET url/health``: (its JSON, "") when it answers 200, else (None, the problem)."""
        try:
            response = self._http.get(url + "/health")
        except httpx.TransportError as e:
            return None, f"{type(e).__name__}: {e}"
        if response.status_code == 200:
            try:
                body = response.json()
            except ValueError:
                body = None
            return body if isinstance(body, dict) else {}, ""
        return None, f"HTTP {response.status_code}: {_detail(response)}"

    @staticmethod
    def _parse(response: httpx.Response, endpoint: str, n_queries: int) -> list[list]:
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
        return result

    def check_health(self, wait_s: float = 0.0) -> dict:
        """GET /health, polling up to wait_s seconds -> the /health answer (of the first endpoint when there are
        several: they serve one index); raise RetrievalUnavailable('... not answering at URL; start it with
        retrieval_launch.sh', or '... still loading its index') if it never answers 200. Several endpoints: all
        must answer and form one index (RetrievalError naming the mismatch otherwise)."""
        if self.several:
            with self._shards_lock:
                shards = self._discover(wait_s, require_all=True)
                self._set_layout(shards)
            body, _ = self._health(shards[0].urls[0])
            return body or {}
        deadline = time.monotonic() + wait_s
        last = "no answer"
        while True:
            body, last = self._health(self.url)
            if body is not None:
                _require_ours(self.url, body)
                if body.get("shard") is not None:
                    what = Served.from_health(self.url, body).what()
                    raise RetrievalError(f"retrieval service at {self.url} serves only {what}; give the URLs of all "
                                         "shards (comma-separated) in retriever.url")
                return body
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
        if last.startswith("HTTP 503") and "loading" in last:
            raise RetrievalUnavailable(f"retrieval service at {self.url} is still loading its index after "
                                       f"{wait_s:.0f}s ({last}); wait longer")
        raise RetrievalUnavailable(f"retrieval service not answering at {self.url} ({last}); {LAUNCH_HINT}")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _require_ours(url: str, health: dict) -> None:
    """``RetrievalError`` when the ``GET /health`` answer of ``url`` is not a retrieval service's (another program
    listens on that port): its searches would all fail."""
    if not isinstance(health.get("retriever"), str) or "corpus_sha256" not in health:
        raise RetrievalError(f"{url} answers GET /health but is not a retrieval service (its answer "
                             f"{json.dumps(health)[:120]} names no retriever and corpus); check the host and port "
                             f"({LAUNCH_HINT})")


def _rejected(endpoint: str, response: httpx.Response) -> RetrievalError:
    return RetrievalError(f"retrieval service at {endpoint} rejected the request (HTTP {response.status_code}): "
                          f"{_detail(response)}")


def _final(response: httpx.Response) -> bool:
    """A 5xx whose body says ``"retryable": false``: the service cannot answer and waiting will not change that (an
    online backend's spent request budget or refused API key; ``retrieval_server/search/online/backend.py``)."""
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("retryable") is False


def _detail(response: httpx.Response) -> str:
    """The server's ``detail`` message when it sent one, else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:200]
