"""A loopback stand-in for the four online search engines, speaking each one's documented JSON (no internet here).

One threaded ``http.server`` answers ``/serpapi``, ``/google``, ``/serper`` and ``/brave`` the way SerpAPI
(``organic_results``), Google Custom Search (``items``), Serper (``organic``, POST) and Brave (``web.results``)
do, checking the key where each engine takes it (401/403 with the engine's error body otherwise). What a query
gets is chosen by its first word, so a test can ask for each failure:

- ``fail429-N-tag ...`` / ``fail500-N-tag ...``: the first N requests of this exact query answer 429 (with
  ``Retry-After: 0``) or 500, later ones answer normally;
- ``slow-S ...``: the answer comes after S seconds;
- ``malformed ...``: a 200 whose body is cut-off JSON; ``shape ...``: valid JSON of the wrong shape;
- ``nothing ...``: the engine's documented answer for no results;
- while ``fail_all`` holds a status, every request (any query) gets it;
- anything else: results. Without an index, ``n`` (the engine's count parameter) made-up results derived from the
  query; with ``index``/``corpus`` (a BM25 index built by ``retrieval_server.build_index``), the corpus passages
  BM25 ranks first, title and text split from Search-R1's ``"Title"\\ntext`` contents.

``requests`` lists every request received ([engine, query, status], status None while it is being answered);
``handle_s`` the time each took to answer (the engine's own time, for the overhead benchmark).
``python -m tests.retrieval_server.loopback_engines --port P --index DIR --corpus C.jsonl --key KEY`` runs one as a
process (the demo GRPO run against an online backend).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

ENGINE_PATHS = ("serpapi", "google", "serper", "brave")


def _result(engine: str, title: str, text: str, link: str) -> dict:
    if engine == "brave":
        return {"title": title, "description": text, "url": link, "type": "search_result"}
    return {"title": title, "snippet": text, "link": link, "position": 0}


def _page(engine: str, results: list[dict]) -> dict:
    if engine == "serpapi":
        return {"search_metadata": {"status": "Success"}, "organic_results": results}
    if engine == "google":
        return {"kind": "customsearch#search", "items": results} if results else {"kind": "customsearch#search"}
    if engine == "serper":
        return {"searchParameters": {}, "organic": results}
    return {"type": "search", "web": {"type": "search", "results": results}}


def _nothing(engine: str) -> dict:
    if engine == "serpapi":
        return {"search_metadata": {"status": "Success"}, "search_information": {"organic_results_state":
                                                                                 "Fully empty"},
                "error": "Google hasn't returned any results for this query."}
    return _page(engine, [])


def _error_body(engine: str, status: int, message: str) -> dict:
    if engine in ("google", "brave"):
        return {"error": {"code": status, "message" if engine == "google" else "detail": message}}
    if engine == "serper":
        return {"message": message, "statusCode": status}
    return {"error": message}


class LoopbackEngines:
    """The four engines on ``http://127.0.0.1:port/<engine>``; ``url(engine)`` is what ``--search-url`` takes."""

    def __init__(self, key: str, port: int = 0, index: str | Path | None = None, corpus: str | Path | None = None):
        self.key = key
        self.requests: list[list] = []  # [engine, query, status (None until answered)] of every request
        self.handle_s: list[float] = []
        self._failures: dict[tuple[str, str], int] = {}  # (engine, query) -> failing answers given so far
        self._lock = threading.Lock()
        self.fail_all: int | None = None  # a status (429, 500) every request gets while set: an engine in trouble
        self._retriever = self._rows = None
        if index is not None:
            from retrieval_server.search.bm25 import BM25Retriever

            self._retriever = BM25Retriever.load(index, threads=1)
            self._rows = [json.loads(line) for line in Path(corpus).read_text().splitlines() if line.strip()]
        engines = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engines._serve(self)

            def do_POST(self) -> None:
                engines._serve(self)

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def url(self, engine: str) -> str:
        return f"http://127.0.0.1:{self.port}/{engine}"

    def start(self) -> LoopbackEngines:
        self._thread = threading.Thread(target=self._server.serve_forever, name="loopback-engines", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def count(self, engine: str | None = None) -> int:
        with self._lock:
            return sum(1 for e, _, _ in self.requests if engine is None or e == engine)

    # -- answering ---------------------------------------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        start = time.perf_counter()
        parsed = urlparse(handler.path)
        engine = parsed.path.strip("/")
        params = {name: values[0] for name, values in parse_qs(parsed.query).items()}
        if handler.command == "POST":
            length = int(handler.headers.get("content-length", 0))
            params.update(json.loads(handler.rfile.read(length) or b"{}"))
        query = str(params.get("q", ""))
        record = [engine, query, None]  # listed on arrival (a stalled answer is a request seen), status once known
        with self._lock:
            self.requests.append(record)
        status, body, headers = self._answer(engine, handler.headers, params, query)
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        with self._lock:
            record[2] = status
            self.handle_s.append(time.perf_counter() - start)
        try:
            handler.send_response(status)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(payload)))
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the backend gave up waiting (its timeout)
            pass

    def _answer(self, engine: str, headers, params: dict, query: str) -> tuple[int, dict | bytes, dict]:
        if engine not in ENGINE_PATHS:
            return 404, {"error": f"no engine at /{engine}"}, {}
        given = {"serpapi": params.get("api_key"), "google": params.get("key"),
                 "serper": headers.get("X-API-KEY"), "brave": headers.get("X-Subscription-Token")}[engine]
        if given != self.key:
            status = 403 if engine == "serper" else 401
            # echoes the key it got, as some services do: the backend must not pass it on
            return status, _error_body(engine, status, f"Invalid API key {given}."), {}
        if self.fail_all is not None:
            return self.fail_all, _error_body(engine, self.fail_all, "Rate limit exceeded"), {"Retry-After": "0"}
        if engine == "google" and not params.get("cx"):
            return 400, _error_body(engine, 400, "Missing cx"), {}
        word = query.split(" ", 1)[0]
        if word.startswith(("fail429-", "fail500-")):
            status, n = int(word[4:7]), int(word.split("-")[1])
            with self._lock:
                seen = self._failures.get((engine, query), 0)
                self._failures[(engine, query)] = seen + 1
            if seen < n:
                return status, _error_body(engine, status, "Rate limit exceeded" if status == 429 else "Internal"), \
                    ({"Retry-After": "0"} if status == 429 else {})
        elif word.startswith("slow-"):
            time.sleep(float(word[5:]))
        elif word == "malformed":
            return 200, b'{"organic_results": [{"title": "cut', {}
        elif word == "shape":
            return 200, {"organic_results": {"title": "not a list"}, "items": {}, "organic": {},
                         "web": {"results": {}}}, {}
        elif word == "nothing":
            return 200, _nothing(engine), {}
        n = int(params.get("count" if engine == "brave" else "num", 10))
        return 200, _page(engine, self._results(engine, query, n)), {}

    def _results(self, engine: str, query: str, n: int) -> list[dict]:
        if self._retriever is None:
            slug = "-".join(query.lower().split())
            mark = ("<strong>", "</strong>") if engine == "brave" else ("", "")
            return [_result(engine, f"{query} ({i + 1})", f"{mark[0]}{query}{mark[1]} &amp; result {i + 1} of "
                            f"{engine}", f"https://example.test/{slug}/{i + 1}") for i in range(n)]
        _, rows = self._retriever.search([query], min(n, len(self._rows)))
        out = []
        for row in rows[0]:
            if row < 0:
                continue
            passage = self._rows[row]
            title, _, text = passage["contents"].partition("\n")
            out.append(_result(engine, title.strip('"'), text, f"https://loopback.test/{passage['id']}"))
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--key", required=True, help="the API key the engines accept")
    p.add_argument("--index", default=None, help="BM25 index directory of --corpus (default: made-up results)")
    p.add_argument("--corpus", default=None)
    args = p.parse_args()
    engines = LoopbackEngines(args.key, args.port, args.index, args.corpus)
    print(f"loopback engines on http://127.0.0.1:{engines.port}/{{{','.join(ENGINE_PATHS)}}}", flush=True)
    try:
        engines._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        n = len(engines.handle_s)
        if n:
            print(f"served {n} requests, engine time mean {1000 * sum(engines.handle_s) / n:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
