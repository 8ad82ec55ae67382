"""``--delay-ms`` (benchmarks only): every answer held that long after its search, concurrent requests overlapping.

Guards against a delay that blocks the event loop or the search threads (then concurrent requests would queue
behind each other and a benchmark of an asynchronous rollout would measure the service, not the rollout), a
delay that changes the answer, and a negative delay accepted silently.
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from retrieval_server.launcher import ServerProcess
from tests.retrieval_server.conftest import SERVER_ARGS

pytestmark = pytest.mark.slow  # starts retrieval servers: not in `make test-fast`

DELAY_S = 0.3
QUERY = {"queries": ["river bridges"], "topk": 2}


@pytest.fixture(scope="module")
def slow_server(bm25_index, corpus_path):
    with ServerProcess(bm25_index, corpus_path, [*SERVER_ARGS, "--delay-ms", str(DELAY_S * 1000)]) as server:
        server.wait_ready()
        yield server


def _post(server) -> tuple[dict, float]:
    start = time.perf_counter()
    answer = httpx.post(server.url + "/retrieve", json=QUERY, timeout=60).json()
    return answer, time.perf_counter() - start


def test_answer_is_delayed_and_unchanged(slow_server, bm25_server):
    assert httpx.get(slow_server.url + "/health").json()["delay_ms"] == DELAY_S * 1000
    answer, seconds = _post(slow_server)
    assert seconds >= DELAY_S
    assert answer == _post(bm25_server)[0]


def test_concurrent_requests_wait_at_the_same_time(slow_server):
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _post(slow_server)[0], range(8)))
    assert time.perf_counter() - start < 8 * DELAY_S / 2  # serialised delays would take 2.4 s
    assert all(a == answers[0] for a in answers)


def test_negative_delay_is_refused(bm25_index, corpus_path):
    done = subprocess.run([sys.executable, "-m", "retrieval_server.serve", "--index", str(bm25_index), "--corpus",
                           str(corpus_path), "--delay-ms", "-1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--delay-ms must be 0 (off) or a positive" in done.stderr
