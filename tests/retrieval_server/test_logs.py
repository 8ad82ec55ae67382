"""What the retrieval service logs: one summary line per interval with requests (counts that match what was
sent), nothing per request, and no library chatter at INFO (FAISS's build probes, httpx's requests)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest

from retrieval_server.launcher import ServerProcess
from retrieval_server.logs import RequestStats

SUMMARY = re.compile(r"retrieval: (?P<requests>[\d,]+) requests, (?P<queries>[\d,]+) queries in [\d.]+ s "
                     r"\([\d.,]+ q/s\), p50 (?P<p50>[\d.]+|-)(?: ms)?, p99 (?P<p99>[\d.]+|-)(?: ms)?, "
                     r"(?P<errors>[\d,]+) errors \(4xx (?P<e4xx>[\d,]+), 5xx (?P<e5xx>[\d,]+)\)")


def _totals(log: str) -> tuple[int, dict[str, int]]:
    """The number of summary lines in ``log`` and the sums of their counts."""
    matches = list(SUMMARY.finditer(log))
    keys = ("requests", "queries", "errors", "e4xx", "e5xx")
    return len(matches), {k: sum(int(m[k].replace(",", "")) for m in matches) for k in keys}


@pytest.mark.slow  # starts a server
def test_summary_counts_what_was_sent(bm25_index, corpus_path):
    """Guards against a silent service (no way to see its load without a benchmark), a summary whose counts do
    not match the traffic, a line per request flooding the terminal, and lines for idle intervals."""
    with ServerProcess(bm25_index, corpus_path, ["--threads", "1", "--log-interval", "1"]) as server:
        server.wait_ready()
        for i in range(3):
            response = httpx.post(server.url + "/retrieve", json={"queries": ["Varnel River", f"Dunmere {i}"]})
            assert response.status_code == 200
        bad = httpx.post(server.url + "/retrieve", content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400
        expected = {"requests": 3, "queries": 6, "errors": 1, "e4xx": 1, "e5xx": 0}
        deadline = time.monotonic() + 30
        while _totals(server.log_text())[1] != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        lines, totals = _totals(server.log_text())
        assert totals == expected, server.log_text()
        time.sleep(2.5)  # idle intervals: no new line
        log = server.log_text()
    assert _totals(log) == (lines, expected), log
    assert all(m["p50"] != "-" for m in SUMMARY.finditer(log) if m["requests"] != "0")
    assert "POST /retrieve" not in log and "HTTP Request" not in log


def test_request_stats_percentiles_and_line():
    """Guards against wrong percentiles (compared with a plain nearest-rank loop), errors counted as answered
    requests, and a stale interval leaking into the next one."""
    stats = RequestStats()
    latencies_s = [(i * 37 % 100 + 1) / 1000 for i in range(100)]  # 1..100 ms, shuffled
    for seconds in latencies_s:
        stats.record(200, 3, seconds)
    stats.record(422, 0, 5.0)
    stats.record(503, 0, 9.0)
    line = stats.summary()
    ordered = sorted(latencies_s)
    expected = {}
    for p in (50, 99):  # nearest rank: the smallest latency with at least p% of the requests at or below it
        for rank, seconds in enumerate(ordered, start=1):
            if rank / len(ordered) >= p / 100:
                expected[p] = seconds * 1000
                break
    m = SUMMARY.search(line)
    assert m is not None, line
    assert (m["requests"], m["queries"], m["errors"], m["e4xx"], m["e5xx"]) == ("100", "300", "2", "1", "1")
    assert (float(m["p50"]), float(m["p99"])) == (round(expected[50], 1), round(expected[99], 1)) == (50.0, 99.0)
    assert stats.summary() is None  # nothing since the last summary
    stats.record(404, 0, 0.001)
    assert "0 requests, 0 queries" in stats.summary()


@pytest.mark.slow  # a subprocess
def test_library_chatter_is_below_info_but_errors_show():
    """Guards against FAISS's probe of optional builds ("Could not load library with AVX2 support" and the import
    error) and httpx's per-request lines filling the log at INFO, and against hiding a real FAISS failure."""
    code = ("import logging; from retrieval_server.logs import configure_logging; configure_logging(); "
            "import faiss; logging.getLogger('httpx').info('HTTP Request: POST http://127.0.0.1:8000/retrieve'); "
            "logging.getLogger('faiss.loader').error('a real FAISS failure'); "
            "logging.getLogger('retrieval_server.serve').info('still at INFO')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a real FAISS failure" in done.stderr and "still at INFO" in done.stderr
    assert "Could not load library" not in done.stderr and "Loading faiss" not in done.stderr
    assert "HTTP Request" not in done.stderr


def test_a_slow_rate_is_not_rounded_to_zero():
    """Guards against the summary line printing 0 q/s for a few queries over a long interval (issue 37)."""
    from retrieval_server.logs import _rate

    assert (_rate(0.25), _rate(12.5), _rate(329.4), _rate(12345.6)) == ("0.25", "12.5", "329", "12,346")
