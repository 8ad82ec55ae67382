"""The online search backends (``serve --backend serpapi|google|serper|brave``) against loopback engines that speak
each engine's documented JSON (``loopback_engines.py``): the backend is the real client, the service the real
``python -m retrieval_server.serve`` process, the client the trainer's ``RetrievalClient``.

Guards against: an engine's answer reaching the policy in another format than Search-R1's passages (or with its
HTML); a replay that is not exact or still asks the engine; a spent budget that hangs a run instead of stopping it;
a 429 that fails a query instead of being waited out; a stalled or broken engine that hangs the service or gives
a traceback instead of an error naming the engine; the API key in a log, a cache file, an answer or the run's
record of the service.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from retrieval_server.launcher import ServerProcess, free_port
from retrieval_server.search.online.backend import NO_RESULTS
from retrieval_server.serve.cli import parse_args
from search_r1.search.client import RetrievalClient, RetrievalError, RetrievalUnavailable
from search_r1.search.identity import record_retrieval
from tests.retrieval_server.loopback_engines import ENGINE_PATHS, LoopbackEngines

pytestmark = pytest.mark.slow  # starts services and engines

KEY = "sk-loopback-7Qz9xKv2mW"  # what the loopback engines accept; must never be written anywhere
KEY_ENV = "SEARCH_R1_TEST_ENGINE_KEY"
# Fast retries for the tests; a 1 s engine timeout leaves loaded CI machines room for normal answers.
FAST = ["--backoff", "0.01", "--engine-timeout", "1", "--max-retries", "2", "--log-interval", "0.2"]


def start_service(engines: LoopbackEngines, engine: str, cache_dir: Path, *extra: str,
                  key: str = KEY) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "retrieval_server.serve", "--backend", engine, "--api-key-env", KEY_ENV,
               "--search-url", engines.url(engine), "--cache-dir", str(cache_dir), "--port", str(port), *FAST,
               *(["--google-cx", "test-cx"] if engine == "google" else []), *extra]
    server = ServerProcess(command=command, port=port, env={**os.environ, KEY_ENV: key})
    server.wait_ready(60)  # stops the server itself if it never becomes ready
    return server


def retrieve(server: ServerProcess, queries: list[str], topk: int = 2, **flags) -> httpx.Response:
    return httpx.post(server.url + "/retrieve", json={"queries": queries, "topk": topk, **flags}, timeout=30)


def made_up(engine: str, query: str, i: int) -> dict:
    """The passage the loopback engine's result ``i`` (from 1) becomes: HTML and entities gone, title quoted."""
    slug = "-".join(query.lower().split())
    return {"id": f"https://example.test/{slug}/{i}", "contents": f'"{query} ({i})"\n{query} & result {i} of {engine}'}


@pytest.fixture(scope="module")
def engines():
    engines = LoopbackEngines(KEY).start()
    try:
        yield engines
    finally:
        engines.stop()


@pytest.fixture(scope="module")
def services(engines, tmp_path_factory):
    """One service per engine, each with its own cache."""
    started = {}
    try:
        for engine in ENGINE_PATHS:
            started[engine] = start_service(engines, engine, tmp_path_factory.mktemp(f"cache_{engine}"))
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.mark.parametrize("engine", ENGINE_PATHS)
def test_each_engine_answers_in_search_r1_passage_format(engines, services, engine):
    """SerpAPI's organic_results, Google's items, Serper's organic, Brave's web.results (with <strong> marks and an
    entity) become {"id", "contents": "\\"Title\\"\\ntext"} passages, topk of them; an engine's documented
    no-results answer becomes the one no-results passage; the scored form and the trainer's client work too."""
    server = services[engine]
    before = engines.count(engine)
    response = retrieve(server, ["Who wrote Laemze", "nothing at all"])
    assert response.status_code == 200, response.text
    assert response.json() == {"result": [[made_up(engine, "Who wrote Laemze", 1),
                                           made_up(engine, "Who wrote Laemze", 2)], [NO_RESULTS]]}
    assert engines.count(engine) - before == 2
    scored = retrieve(server, ["Who wrote Laemze"], return_scores=True).json()["result"][0]
    assert [hit["document"] for hit in scored] == response.json()["result"][0]
    assert [hit["score"] for hit in scored] == [1.0, 0.5]
    with RetrievalClient(server.url, topk=2) as client:
        health = client.check_health()
        assert (health["retriever"], health["index"]) == ("online", engine)
        assert client.search(["Who wrote Laemze"]) == [response.json()["result"][0]]
    opened = httpx.post(server.url + "/doc", json={"ids": ["https://example.com/a"]})  # no corpus to open from
    assert opened.status_code == 404 and "online engine" in opened.json()["detail"], opened.text
    for url in (server.url, f"{server.url},{server.url}"):  # one endpoint; replicas (as ray://NAME lists them)
        with RetrievalClient(url, topk=2) as client, pytest.raises(RetrievalError, match="holds no documents"):
            client.documents(["https://example.com/a"])


def test_429_and_5xx_are_retried_with_backoff_and_the_answer_arrives(engines, services):
    """The engine sees each retry (429, 429, 200 / 500, 200) and the client gets the answer, not an error."""
    server = services["serpapi"]
    response = retrieve(server, ["fail429-2-a rate limited", "fail500-1-b flaky"])
    assert response.status_code == 200, response.text
    assert response.json()["result"][0][0] == made_up("serpapi", "fail429-2-a rate limited", 1)
    statuses = {q: [s for e, query, s in engines.requests if e == "serpapi" and query == q]
                for q in ("fail429-2-a rate limited", "fail500-1-b flaky")}
    assert statuses == {"fail429-2-a rate limited": [429, 429, 200], "fail500-1-b flaky": [500, 200]}
    assert httpx.get(server.url + "/health").json()["retries"] >= 3


def test_a_slow_or_down_engine_is_answered_like_a_local_outage(engines, services):
    """A stalled engine gets 503 naming the timeout (after --max-retries), never a hang; an engine that keeps
    failing is, to the trainer's client, a retrieval outage: it backs off, then raises RetrievalUnavailable (the
    trainer then checkpoints and stops)."""
    server = services["google"]
    response = retrieve(server, ["slow-1.5 stalled engine"])
    assert response.status_code == 503, response.text
    assert response.json()["retryable"] is True
    assert "google" in response.json()["detail"]
    assert "no answer within --engine-timeout 1 s" in response.json()["detail"]
    assert sum(q == "slow-1.5 stalled engine" for _, q, _ in engines.requests) == 3  # --max-retries 2: 3 attempts
    with RetrievalClient(server.url, topk=2, outage_timeout_s=0.3, backoff=0.1) as client:
        with pytest.raises(RetrievalUnavailable, match=r"did not answer after 3 attempts.*HTTP 500"):
            client.search(["fail500-99-c down"])


def test_malformed_or_misshapen_json_is_a_clear_error(services):
    """Cut-off JSON and JSON of the wrong shape get 502 naming the engine and what was wrong (no traceback), and are
    not cached (asked again, the engine is asked again)."""
    malformed = retrieve(services["serper"], ["malformed answer"])
    assert malformed.status_code == 502
    assert malformed.json()["detail"].startswith("serper answered malformed JSON (HTTP 200")
    shape = retrieve(services["brave"], ["shape of the answer"])
    assert shape.status_code == 502
    assert shape.json()["detail"] == "brave answered web.results as a dict, not a list"
    assert retrieve(services["serper"], ["malformed answer"]).status_code == 502
    assert httpx.get(services["serper"].url + "/health").json()["failures"] == 2


def test_budget_exhausted_is_a_clear_error_and_stops_the_client_at_once(engines, tmp_path):
    """--max-requests 2: two queries are fetched, the third is refused without an engine request (503, retryable
    false, the detail naming the budget); cached queries still answer; the trainer's client raises
    RetrievalUnavailable at once (its outage wait would be 30 s) with the service's message."""
    server = start_service(engines, "serper", tmp_path / "cache", "--max-requests", "2", "--cost-per-request",
                           "0.001")
    try:
        before = engines.count("serper")
        assert retrieve(server, ["budget one", "budget two"]).status_code == 200
        refused = retrieve(server, ["budget three"])
        assert refused.status_code == 503
        assert refused.json()["retryable"] is False
        assert "budget exhausted: 2 of --max-requests 2 requests to serper made" in refused.json()["detail"]
        assert engines.count("serper") - before == 2
        assert retrieve(server, ["budget two"]).status_code == 200  # from the cache
        with RetrievalClient(server.url, topk=2, outage_timeout_s=30) as client:
            with pytest.raises(RetrievalUnavailable, match="says waiting will not help.*--max-requests 2"):
                client.search(["budget four"])
        health = httpx.get(server.url + "/health").json()
        assert (health["requests_left"], health["cost_usd"]) == (0, pytest.approx(0.002))
        server.proc.terminate()
        server.proc.wait(30)
        assert "cost $0.0020 ($0.001/request), budget 0 of 2 requests left (totals)" in server.log_text()
    finally:
        server.stop()


def test_cache_replays_a_run_with_the_engine_stopped(tmp_path):
    """A second service over the same cache directory, with the engine stopped, gives the same answers and asks
    the engine nothing; repeats cost nothing in the first run too; the hit rate is in /health and the summary
    line; the cache is keyed by topk (another topk is a miss: with the engine down, an outage)."""
    engines = LoopbackEngines(KEY).start()
    batches = [["replay a", "replay b", "replay a"], ["replay b", "replay c"]]
    try:
        first = start_service(engines, "brave", tmp_path / "cache")
        try:
            answers = [retrieve(first, batch).json() for batch in batches]
            assert sorted(q for _, q, _ in engines.requests) == ["replay a", "replay b", "replay c"]
            health = httpx.get(first.url + "/health").json()
            assert (health["queries"], health["cache_hits"], health["requests"]) == (5, 2, 3)
            first.proc.terminate()
            first.proc.wait(30)
            assert "cache 40.0% hits (2 of 5 queries)" in first.log_text()
        finally:
            first.stop()
    finally:
        engines.stop()
    replay = start_service(engines, "brave", tmp_path / "cache")
    try:
        assert [retrieve(replay, batch).json() for batch in batches] == answers
        health = httpx.get(replay.url + "/health").json()
        assert (health["requests"], health["cache_hit_rate"]) == (0, 1.0)
        other_topk = retrieve(replay, ["replay a"], topk=1)
        assert other_topk.status_code == 503 and "ConnectError" in other_topk.json()["detail"]
    finally:
        replay.stop()


def test_the_api_key_is_in_no_log_file_or_answer(engines, tmp_path):
    """SerpAPI takes the key as a URL parameter: after answers, retries, malformed JSON and (another service) a
    refused key whose error body echoes it, the key is in neither service's log, the cache files, /health, /stats,
    an error detail, nor the run directory's record of the service; the refused key's error names the variable."""
    texts = []
    # stopped on leaving, also when the second fails to start
    with start_service(engines, "serpapi", tmp_path / "cache") as server, \
            start_service(engines, "serpapi", tmp_path / "cache_wrong", key="not-the-key-5Yp") as wrong:
        for queries in (["key check"], ["fail429-1-k key"], ["malformed key"]):
            texts.append(retrieve(server, queries).text)
        refused = retrieve(wrong, ["key check"])
        assert refused.status_code == 502 and refused.json()["retryable"] is False
        assert f"serpapi refused the API key in ${KEY_ENV} (HTTP 401: Invalid API key ***.)" in refused.json()["detail"]
        texts.append(refused.text)
        for path in ("/health", "/stats"):
            texts.append(httpx.get(server.url + path).text)
        health = httpx.get(server.url + "/health").json()
        record_retrieval(tmp_path / "run", server.url, health, resuming=False)
        for s in (server, wrong):
            s.proc.terminate()
            s.proc.wait(30)
            texts.append(s.log_text())
    assert "retry 1 of 2" in texts[-2] and "(totals)" in texts[-2]  # the log did record the failures
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "responses.sqlite" for p in files) and any(p.name == "retrieval.json" for p in files)
    for i, text in enumerate(texts):
        assert KEY not in text and "not-the-key-5Yp" not in text, f"text {i}: {text[:300]}"
    for path in files:
        data = path.read_bytes()
        assert KEY.encode() not in data and b"not-the-key-5Yp" not in data, path


@pytest.mark.parametrize("launch", [[sys.executable, "-m", "retrieval_server.serve"], ["bash", "retrieval_launch.sh"]])
def test_a_missing_key_variable_is_refused_naming_it(launch):
    """A missing key variable exits 2 naming it, before the port is bound; retrieval_launch.sh hands an online
    backend straight to serve (it prepares no demo index)."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    done = subprocess.run([*launch, "--backend", "brave", "--api-key-env", KEY_ENV], env=env, capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2, done.stderr
    assert "demo" not in done.stderr
    assert f"environment variable {KEY_ENV} (named by --api-key-env) is not set" in done.stderr


@pytest.mark.parametrize("argv, message", [
    (["--backend", "google", "--api-key-env", "X"], "--backend google needs --google-cx"),
    (["--backend", "serper"], "--backend serper needs --api-key-env VAR"),
    (["--backend", "brave", "--api-key-env", "X", "--index", "i"], "--index name a local index"),
    (["--backend", "brave", "--api-key-env", "X", "--max-requests", "0"], "--max-requests must be at least 1"),
    ([], "--index and --corpus are required"),
])
def test_flag_errors_name_the_flag(argv, message, capsys):
    """Flags that do not fit the backend are refused naming the flag."""
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err

