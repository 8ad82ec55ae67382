"""RetrievalClient over replicas of one index (comma-separated ``retriever.url``): failover under load, slow
replicas, all replicas down. Real BM25 servers on loopback."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess
from search_r1.search import RetrievalClient, RetrievalUnavailable
from tests.retrieval_server.retrieval_test_corpus import PASSAGES, corpus_lines

pytestmark = pytest.mark.slow  # starts services

QUERIES = [text for _, _, text in PASSAGES]  # each finds its own passage first
ARGS = ["--threads", "1", "--max-topk", "4"]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Two replicas of a BM25 index, and a third one that answers every search 3 s late."""
    root = tmp_path_factory.mktemp("replicas")
    corpus = root / "corpus.jsonl"
    corpus.write_text("\n".join(corpus_lines()) + "\n")
    build_index(corpus, root / "index", retriever="bm25", progress=False)
    servers = [ServerProcess(root / "index", corpus, ARGS) for _ in range(2)]
    servers.append(ServerProcess(root / "index", corpus, [*ARGS, "--delay-ms", "3000"]))
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


def _expected(url: str) -> list[list[dict]]:
    with RetrievalClient(url, topk=2) as client:
        return client.search(QUERIES)


def test_a_slow_replica_is_abandoned_for_another(replicas, caplog):
    """Guards against one slow replica holding up the rollout: a request over replica_timeout_s goes to the other
    replica, and the slow one is skipped afterwards."""
    slow, fast = replicas[2].url, replicas[1].url
    want = _expected(fast)
    with RetrievalClient(f"{slow},{fast}", topk=2, replica_timeout_s=0.5, replica_cooldown_s=60) as client, \
            caplog.at_level(logging.WARNING, logger="search_r1.search.client"):
        client.check_health()
        start = time.monotonic()
        for _ in range(4):  # round-robin would send one of the first two to the slow replica
            assert client.search(QUERIES) == want
        assert time.monotonic() - start < 2.5  # one abandoned request at most, never the 3 s delay
    failovers = [r.getMessage() for r in caplog.records if "request sent to another replica" in r.getMessage()]
    assert len(failovers) == 1 and slow in failovers[0] and "ReadTimeout" in failovers[0]


def test_replica_killed_under_load_loses_no_request_then_all_down_is_an_outage(replicas, caplog):
    """Guards against searches failing (or returning wrong passages) when a replica dies while requests from
    several threads are in flight, against the dead replica being tried again during its cooldown, and against an
    outage of every replica hanging instead of raising RetrievalUnavailable. (Runs last: kills both replicas.)"""
    a, b = replicas[0], replicas[1]
    want = _expected(b.url)
    done, results = threading.Semaphore(0), []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        for i in range(15):
            queries = [QUERIES[(seed + i + j) % len(QUERIES)] for j in range(3)]
            got = client.search(queries)
            with lock:
                results.append(got == [want[QUERIES.index(q)] for q in queries])
            done.release()

    with RetrievalClient(f"{a.url},{b.url}", topk=2, timeout=5.0, replica_timeout_s=2.0, replica_cooldown_s=60,
                         outage_timeout_s=0.6, backoff=0.05, max_backoff=0.2) as client, \
            caplog.at_level(logging.WARNING, logger="search_r1.search.client"):
        client.check_health()
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(worker, seed) for seed in range(6)]
            for _ in range(20):  # kill once 20 searches have come back, with others in flight
                done.acquire()
            a.proc.kill()
            a.proc.wait()
            for future in futures:
                future.result()  # a failed search raises here
        assert len(results) == 6 * 15 and all(results)
        failed_over = [r for r in caplog.records if "request sent to another replica" in r.getMessage()]
        assert failed_over and all(a.url in r.getMessage() for r in failed_over)
        assert len(failed_over) <= 6  # at most the requests in flight or picked at the kill; then a is skipped
        caplog.clear()
        assert client.search(QUERIES) == want
        assert not caplog.records

        b.proc.kill()
        b.proc.wait()
        start = time.monotonic()
        with pytest.raises(RetrievalUnavailable, match=rf"{a.url}/retrieve, {b.url}/retrieve \(every replica of the "
                                                       r"index\) failed for .*outage_timeout_s=0.6"):
            client.search(QUERIES[:2])
        assert 0.6 <= time.monotonic() - start < 3.0
