"""RetrievalClient against the real retrieval service (BM25 index of a small corpus) on loopback."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess, free_port
from search_r1.search import RetrievalClient, RetrievalError, RetrievalUnavailable

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

CORPUS = [
    ("paris", "Paris", "Paris is the capital and largest city of France, on the river Seine."),
    ("berlin", "Berlin", "Berlin is the capital of Germany and its largest city by population."),
    ("everest", "Mount Everest", "Mount Everest is the highest mountain above sea level, in the Himalayas."),
    ("nile", "Nile", "The Nile is a major river in Africa flowing north into the Mediterranean Sea."),
    ("tokyo", "Tokyo", "Tokyo is the capital of Japan and one of the most populous cities in the world."),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A BM25 server; not waited for here: the tests reach it through ``check_health(wait_s=...)``."""
    root = tmp_path_factory.mktemp("client")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n" for i, t, x in CORPUS))
    build_index(corpus, root / "index", retriever="bm25", progress=False)
    with ServerProcess(root / "index", corpus, ["--threads", "1", "--max-topk", "4"]) as process:
        yield process


def _client(server: ServerProcess, **kwargs) -> RetrievalClient:
    client = RetrievalClient(server.url, **{"topk": 2, **kwargs})
    client.check_health(wait_s=300)
    return client


def test_check_health_waits_for_the_index_then_search_matches_the_server(server):
    """Guards against the client reporting an error while the index is still loading, and against it
    reshaping or reordering what the server returned."""
    with _client(server) as client:
        queries = ["capital of Germany", "highest mountain", "river in Africa"]
        docs = client.search(queries)
        raw = httpx.post(server.url + "/retrieve", json={"queries": queries, "topk": 2}).json()["result"]
        assert docs == raw
        assert [d[0]["id"] for d in docs] == ["berlin", "everest", "nile"]
        assert all(set(doc) == {"id", "contents"} for row in docs for doc in row)


def test_more_queries_than_the_server_accepts_are_split_into_requests(server):
    """Guards against a large rollout (more searching rows than the server's --max-queries) failing with
    HTTP 413: the client splits the batch, and the answers keep the queries' order."""
    queries = ["capital of Germany", "highest mountain", "river in Africa"] * 5
    with _client(server) as whole, _client(server, max_batch=4) as split:
        assert split.search(queries) == whole.search(queries)
        assert [d[0]["id"] for d in split.search(queries)] == ["berlin", "everest", "nile"] * 5


def test_empty_query_list_sends_no_request():
    """Guards against an empty search batch failing (or waiting for a service that is not needed)."""
    with RetrievalClient(f"http://127.0.0.1:{free_port()}", topk=3, outage_timeout_s=0) as client:
        assert client.search([]) == []


def test_4xx_is_raised_at_once_naming_the_url(server, caplog):
    """Guards against retrying a request the server rejected (it can never succeed) and losing its reason."""
    with _client(server, topk=9) as client, caplog.at_level(logging.WARNING, logger="search_r1.search.client"):
        with pytest.raises(RetrievalError, match=rf"{server.url}/retrieve rejected the request \(HTTP 422\).*between"):
            client.search(["capital of France"])
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


def test_health_check_names_the_url_when_nothing_listens():
    """Guards against a bare connection error (or a hang) when the user forgot to start the service."""
    url = f"http://127.0.0.1:{free_port()}"
    with RetrievalClient(url, topk=3) as client:
        with pytest.raises(RetrievalError, match=rf"not answering at {url} .*start it with retrieval_launch.sh"):
            client.check_health(wait_s=0.3)


def test_service_killed_mid_use_retries_then_fails_clearly(server, caplog):
    """Guards against the rollout hanging or failing with a bare transport error when the service dies
    between two searches. (Runs last: it kills the module's server.)"""
    with _client(server, timeout=5.0, outage_timeout_s=0.5, backoff=0.01, max_backoff=0.2) as client:
        assert len(client.search(["capital of Japan"])) == 1
        server.proc.kill()
        server.proc.wait()
        with caplog.at_level(logging.WARNING, logger="search_r1.search.client"):
            with pytest.raises(RetrievalUnavailable, match=rf"{server.url}/retrieve failed for .*"
                                                           r"outage_timeout_s=0.5.*retrieval_launch.sh"):
                client.search(["capital of Japan"])
    waits = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(waits) >= 3 and "retry 1 in 0.01s" in waits[0] and "retry 3 in 0.04s" in waits[2]

