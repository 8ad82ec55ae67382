"""The HTTP API: ``POST /retrieve`` (Search-R1 request/response shape), ``GET /health``, ``GET /stats``.

Choices:
- The port is bound before the index is loaded: ``/health`` answers 503 ``{"status": "loading"}``
  until the index is ready, then 200 with what is served (retriever, index, encoder and its dtype,
  cache size, reranker; corpus checksum, a hash of the encoder fingerprint and the shard's rows, which a
  client checks a set of shards and replicas with). ``/stats`` answers the counters of the deduplicating
  query cache. A load failure (corpus or encoder mismatch) is logged and handed to ``on_failure``,
  which stops the server.
- The request body is read and validated by hand, not by a pydantic model, so each bad input gets
  its own status and a message naming the field: 400 body is not JSON; 413 body, query count or
  query length over the limits; 422 wrong types, empty query strings, ``topk`` outside
  ``1..max_topk``. An empty ``queries`` list is valid and answers ``{"result": []}``.
- The body is read incrementally and abandoned at the size limit, so an oversized request costs at
  most ``max_body_bytes`` of memory. It must be UTF-8 JSON (RFC 8259): a body declared as another
  content type or encoding gets 415, bytes that are not UTF-8 get 400, a query with a lone surrogate
  escape (not encodable, the encoder's tokenizer would fail on it) gets 422.
- A body that does not arrive within ``client_timeout_s`` gets 408 and the connection is closed
  (slow clients; ``slow_clients.py`` does the same for headers), so a stalled client holds no
  connection for long. Extra fields are ignored, as Search-R1's server does.
- Search runs through the ``Coalescer`` (worker thread, concurrent requests merged); the JSON answer
  is rendered in a thread too, so the event loop only does I/O and validation. Passages go out as
  their corpus lines, spliced into the answer without decoding and re-encoding them (the largest
  cost of a big BM25 batch after the search itself); a corpus row with fields beyond id/contents
  returns them too, as Search-R1's own server does. ``return_scores`` / ``return_rows`` (optional,
  false by default: Search-R1's shape) add each hit's score / corpus row.
- Each ``/retrieve`` answer (its status, query count and wall time) is recorded in a ``RequestStats`` that a
  task of the app summarises in one log line every ``log_interval_s`` (see ``retrieval_server/logs.py``); 0 records
  nothing. A backend with totals of its own (the online backend: engine requests, cache hit rate, cost) adds them to
  the line.
- A backend that searches elsewhere (``search/online/backend.py``) and cannot answer raises ``BackendError``:
  answered with its status (502/503) and ``{"detail": message, "retryable": bool}``.
- FastAPI's generated API docs (``/docs``, ``/redoc``, ``/openapi.json``) answer 404 unless ``serve --docs`` asks
  for them: a service reachable beyond loopback shows no more than its API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from retrieval_server.logs import RequestStats, log_summaries
from retrieval_server.search.documents import DocumentIndex, UnknownDocument, parse_doc_request
from retrieval_server.search.service import BackendError, Hit, SearchService
from retrieval_server.serve.batcher import Coalescer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; anything beyond gets a 4xx."""

    default_topk: int = 3  # used when a request's topk is missing or null
    max_topk: int = 50
    max_queries: int = 1024  # per request
    max_query_chars: int = 2048  # per query
    client_timeout_s: float = 10.0  # to receive a request's body (and headers, see slow_clients.py)

    @property
    def max_body_bytes(self) -> int:
        """Largest body a valid request can need: every character JSON-escaped as a surrogate pair (12 bytes)."""
        return self.max_queries * (12 * self.max_query_chars + 8) + 4096


@dataclass(frozen=True)
class RetrieveRequest:
    queries: list[str]
    topk: int
    return_scores: bool
    return_rows: bool = False  # each hit also gives its corpus row ("row"): a client merging shards needs it


class RequestError(Exception):
    """A client error: answered with ``status`` and ``{"detail": message}``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def parse_retrieve_request(body: bytes, limits: Limits) -> RetrieveRequest:
    """Validate a ``/retrieve`` body; raises ``RequestError`` with the status to answer."""
    try:
        text = body.decode("utf-8")  # strictly: json.loads would also take UTF-16/32 bytes
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"request body is not UTF-8 (byte {exc.start}); send UTF-8 JSON") from None
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, or an integer literal over Python's digit limit
        raise RequestError(400, "request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise RequestError(422, "request body must be a JSON object with a 'queries' list")
    if "queries" not in payload:
        raise RequestError(422, "'queries' is missing: send {\"queries\": [str, ...], \"topk\": int}")
    queries = payload["queries"]
    if not isinstance(queries, list):
        raise RequestError(422, f"'queries' must be a list of strings, got {type(queries).__name__}")
    if len(queries) > limits.max_queries:
        raise RequestError(413, f"{len(queries)} queries in one request; the limit is {limits.max_queries}")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(422, f"queries[{i}] must be a string, got {type(query).__name__}")
        if len(query) > limits.max_query_chars:
            raise RequestError(413, f"queries[{i}] has {len(query)} characters; the limit is {limits.max_query_chars}")
        if not query.strip():
            raise RequestError(422, f"queries[{i}] is empty")
        if not query.isascii() and _has_surrogate(query):
            raise RequestError(422, f"queries[{i}] is not valid Unicode (a lone surrogate escape such as \\ud800)")
    topk = payload.get("topk")
    if topk is None:
        topk = limits.default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise RequestError(422, f"'topk' must be an integer, got {json.dumps(topk)}")
    elif not 1 <= topk <= limits.max_topk:
        raise RequestError(422, f"'topk' must be between 1 and {limits.max_topk}, got {topk}")
    flags = {name: payload.get(name, False) for name in ("return_scores", "return_rows")}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise RequestError(422, f"'{name}' must be true or false, got {json.dumps(value)}")
    return RetrieveRequest(queries, topk, **flags)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The request body; 415 if it is declared as anything but plain JSON, 413 as soon as it is known to exceed
    ``max_bytes``, 408 if it has not all arrived after ``timeout_s``. (A missing Content-Type is taken as JSON.)"""
    media_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise RequestError(415, f"Content-Type must be application/json, got {media_type or 'nothing'}")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise RequestError(415, f"Content-Encoding {encoding} is not supported; send the JSON uncompressed")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(413, f"request body of {declared} bytes; the limit is {max_bytes}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise RequestError(413, f"request body over {max_bytes} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(408, f"request body not received within {timeout_s:g} s ({size} bytes came)") from None
    except ClientDisconnect:  # nobody reads the answer, but the server logs a 4xx, not a traceback
        raise RequestError(400, f"the client disconnected after {size} bytes of the body") from None
    return b"".join(chunks)


def render_result(hits_per_query: list[list[Hit]], return_scores: bool, return_rows: bool = False) -> bytes:
    """``{"result": [[doc, ...], ...]}``, or with scores and/or rows ``[[{"document": doc, "score": s, "row": r},
    ...], ...]`` (each of ``score`` and ``row`` only when asked for).

    Each ``doc`` is the passage's corpus line spliced in verbatim (valid JSON: checked at build time,
    checksum-verified at load); scores are finite floats, whose ``repr`` is valid JSON.
    """
    if return_scores or return_rows:
        def hit(doc: bytes, score: float, row: int) -> bytes:
            return (b'{"document": ' + doc + (b', "score": ' + repr(score).encode() if return_scores else b"")
                    + (b', "row": ' + str(row).encode() if return_rows else b"") + b"}")

        rows = [b"[" + b", ".join(hit(*h) for h in hits) + b"]" for hits in hits_per_query]
    else:
        rows = [b"[" + b", ".join(doc for doc, *_ in hits) + b"]" for hits in hits_per_query]
    return b'{"result": [' + b", ".join(rows) + b"]}"


async def _run_in_daemon_thread(fn: Callable[[], SearchService]) -> SearchService:
    """``fn()`` in a daemon thread, so that stopping the server during a long load does not wait for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def deliver(setter: Callable, value: object) -> None:
        if not future.done():
            setter(value)

    def work() -> None:
        try:
            result = fn()
        except Exception as exc:
            loop.call_soon_threadsafe(deliver, future.set_exception, exc)
        else:
            loop.call_soon_threadsafe(deliver, future.set_result, result)

    threading.Thread(target=work, name="index-loader", daemon=True).start()
    return await future


class _State:
    """What the app serves; ``service`` is None until the index is loaded."""

    def __init__(self) -> None:
        self.service: SearchService | None = None
        self.coalescer: Coalescer | None = None
        self.documents: DocumentIndex | None = None  # POST /doc (search/documents.py)
        self.error: str | None = None


def create_app(load: Callable[[], SearchService], limits: Limits,
               on_failure: Callable[[BaseException], None], log_interval_s: float, delay_ms: float = 0.0,
               docs: bool = False) -> FastAPI:
    """The FastAPI app; ``load`` runs in a thread after startup and its result is served. Every ``log_interval_s``
    seconds with requests, one summary line is logged (0: none). ``delay_ms`` (benchmarks only) holds every
    ``/retrieve`` answer that long after its search, without blocking other requests (a slow backend). ``docs``
    serves FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` (off by default: 404)."""
    state = _State()
    request_stats = RequestStats() if log_interval_s > 0 else None

    async def load_in_background() -> None:
        try:  # everything up to ready: an error here must not leave /health at "loading" for ever
            service = await _run_in_daemon_thread(load)
            coalescer = Coalescer(service.search, max_batch=limits.max_queries)
            corpus = getattr(service, "corpus", None)  # an online engine has none: /doc then says so
            state.documents = DocumentIndex(corpus) if corpus is not None else None
        except Exception as exc:
            state.error = str(exc)
            logger.error("could not load the index: %s", exc)
            on_failure(exc)
            return
        state.coalescer, state.service = coalescer, service

    def backend_summary() -> str | None:
        return state.service.summary() if state.service is not None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.create_task(load_in_background())]
        if request_stats is not None:
            tasks.append(asyncio.create_task(log_summaries(request_stats, log_interval_s, backend_summary)))
        yield
        for task in tasks:
            task.cancel()
        if state.coalescer is not None:
            await state.coalescer.close()
        if state.service is not None:
            state.service.close()

    app = FastAPI(title="retrieval service", lifespan=lifespan, **({} if docs else
                                                                    {"docs_url": None, "redoc_url": None,
                                                                     "openapi_url": None}))

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        # the rest of an unread (oversized, stalled) body would be parsed as the next request: close instead
        headers = {"connection": "close"} if exc.status in (408, 413) else None
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(BackendError)
    async def backend_error(request: Request, exc: BackendError) -> JSONResponse:
        return JSONResponse({"detail": exc.message, "retryable": exc.retryable}, status_code=exc.status)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.service is None:
            status = {"status": "failed", "detail": state.error} if state.error else {"status": "loading"}
            return JSONResponse(status, status_code=503)
        return JSONResponse({"status": "ok", **state.service.describe(),
                             "default_topk": limits.default_topk, "max_topk": limits.max_topk,
                             "max_queries": limits.max_queries, "max_query_chars": limits.max_query_chars,
                             "delay_ms": delay_ms})

    @app.get("/stats")
    async def stats() -> JSONResponse:
        if state.service is None:
            return JSONResponse({"detail": "the index is still loading; poll GET /health"}, status_code=503)
        return JSONResponse(state.service.stats())

    async def answer(request: Request) -> tuple[Response, int]:
        """The response to a ``/retrieve`` request and its number of queries; raises ``RequestError``."""
        if state.service is None:
            return JSONResponse({"detail": "the index is still loading; poll GET /health"}, status_code=503), 0
        body = await read_body(request, limits.max_body_bytes, limits.client_timeout_s)
        req = parse_retrieve_request(body, limits)
        if not req.queries:
            return Response(b'{"result": []}', media_type="application/json"), 0
        hits_per_query = await state.coalescer.submit(req.queries, req.topk)
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        content = await asyncio.to_thread(render_result, hits_per_query, req.return_scores, req.return_rows)
        return Response(content, media_type="application/json"), len(req.queries)

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        if request_stats is None:
            return (await answer(request))[0]
        start, status, n_queries = time.perf_counter(), 500, 0  # 500 if anything but a RequestError escapes
        try:
            response, n_queries = await answer(request)
            status = response.status_code
            return response
        except (RequestError, BackendError) as exc:
            status = exc.status
            raise
        finally:
            request_stats.record(status, n_queries, time.perf_counter() - start)

    @app.post("/doc")
    async def doc(request: Request) -> Response:
        """Whole documents by id (retrieval_server/search/documents.py)."""
        if state.service is None:
            return JSONResponse({"detail": "the index is still loading; poll GET /health"}, status_code=503)
        body = await read_body(request, limits.max_body_bytes, limits.client_timeout_s)
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            raise RequestError(400, "request body is not valid JSON") from None
        req = parse_doc_request(payload, limits.max_queries)
        if isinstance(req, str):
            raise RequestError(422, req)
        if state.documents is None:
            return JSONResponse({"detail": "this service searches an online engine and holds no documents to open: "
                                           "POST /doc needs a local index (retrieval_server.serve --index)"},
                                status_code=404)
        try:
            content = await asyncio.to_thread(state.documents.render, req.ids)
        except UnknownDocument as err:
            return JSONResponse({"detail": f"no document has the id {err.doc_id!r}", "id": err.doc_id},
                                status_code=404)
        return Response(content, media_type="application/json")

    return app
