"""The online search backend's own cost per query: ``/retrieve`` latency minus the engine's time, against the
loopback engines (``tests/retrieval_server/loopback_engines.py``, made-up results; no internet here).

    python benchmarks/bench_online.py                       # 200 queries per form, serper and serpapi
    python benchmarks/bench_online.py --queries 500 --engines brave

For each engine, a service (``serve --backend ENGINE``, fresh cache) is asked in three forms:
- ``miss, batch 1``: one distinct query per ``/retrieve`` (one engine request each); overhead per query = the
  request's wall time at the client minus the engine handler's own time for that query (measured inside the
  loopback engine). What remains is the backend's work: the service's HTTP in and out, the cache lookup and write,
  the engine client's HTTP round trip on loopback, parsing and rendering.
- ``hit, batch 1``: the same queries again: answered from the disk cache, no engine request.
- ``miss, batch 32``: 32 distinct queries per ``/retrieve`` (fetched ``--engine-concurrency`` at a time): the
  request's wall time minus the longest engine time of its queries, per query.
Figures (median and p90 in ms), not pass/fail; the load average is printed (the machine is shared).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' loopback engines

from retrieval_server.launcher import ServerProcess, free_port  # noqa: E402
from tests.retrieval_server.loopback_engines import LoopbackEngines  # noqa: E402

KEY = "bench-key"


def percentiles(ms: list[float]) -> str:
    """Median and nearest-rank 90th percentile."""
    ordered = sorted(ms)
    return f"median {statistics.median(ordered):6.2f} ms, p90 {ordered[math.ceil(0.9 * len(ordered)) - 1]:6.2f} ms"


def run_engine(engines: LoopbackEngines, engine: str, n: int, cache_dir: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "retrieval_server.serve", "--backend", engine, "--api-key-env", "BENCH_KEY",
               "--search-url", engines.url(engine), "--cache-dir", str(cache_dir), "--port", str(port),
               "--max-requests", str(10 * n), "--log-interval", "0",
               *(["--google-cx", "bench"] if engine == "google" else [])]
    with ServerProcess(command=command, port=port, env={**os.environ, "BENCH_KEY": KEY}) as server, \
            httpx.Client(timeout=30) as client:
        server.wait_ready(60)
        client.post(server.url + "/retrieve", json={"queries": ["warm up"], "topk": 3})
        queries = [f"{engine} question number {i} about laemze" for i in range(n)]
        forms = {}
        for form in ("miss, batch 1", "hit, batch 1"):
            overhead, total = [], []
            for query in queries:
                seen = len(engines.handle_s)
                start = time.perf_counter()
                response = client.post(server.url + "/retrieve", json={"queries": [query], "topk": 3})
                wall = time.perf_counter() - start
                assert response.status_code == 200, response.text
                engine_s = sum(engines.handle_s[seen:])
                total.append(1000 * wall)
                overhead.append(1000 * (wall - engine_s))
            forms[form] = (total, overhead)
        overhead, total = [], []
        for start_i in range(0, n, 32):
            batch = [f"{q} (batch)" for q in queries[start_i:start_i + 32]]
            seen = len(engines.handle_s)
            start = time.perf_counter()
            response = client.post(server.url + "/retrieve", json={"queries": batch, "topk": 3})
            wall = time.perf_counter() - start
            assert response.status_code == 200, response.text
            longest = max(engines.handle_s[seen:])
            total.append(1000 * wall / len(batch))
            overhead.append(1000 * (wall - longest) / len(batch))
        forms["miss, batch 32"] = (total, overhead)
        health = client.get(server.url + "/health").json()
    mean_engine = 1000 * statistics.mean(engines.handle_s)
    print(f"{engine}: engine handler time mean {mean_engine:.2f} ms; cache hit rate "
          f"{health['cache_hit_rate']:.3f}, {health['requests']} engine requests")
    for form, (total, overhead) in forms.items():
        print(f"  {form:15s} per query: wall {percentiles(total)}; overhead {percentiles(overhead)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--queries", type=int, default=200, help="distinct queries per form")
    p.add_argument("--engines", default="serper,serpapi", help="comma-separated, of serpapi,google,serper,brave")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.queries} queries per form")
    engines = LoopbackEngines(KEY).start()
    try:
        for engine in args.engines.split(","):
            with tempfile.TemporaryDirectory() as cache:
                engines.handle_s.clear()
                run_engine(engines, engine, args.queries, Path(cache))
    finally:
        engines.stop()


if __name__ == "__main__":
    main()
