"""Throughput and latency of the retrieval service against the same encode + search called in-process.

    python benchmarks/bench_retrieval.py                      # 100k passages, dense-flat, dense-hnsw, bm25
    python benchmarks/bench_retrieval.py --retrievers bm25    # one of them

Builds (once, cached under ``data/bench/``) a synthetic corpus of text-like passages about fictional
entities and its indexes: BM25, dense flat (encoding the corpus with the default MiniLM encoder, the
slow step), and dense HNSW (from the flat index's vectors, no re-encoding). Then, per retriever and
per batch size (1, 16, 128, 512): the in-process ``retriever.search`` (encode + search) and the
service with one client sending requests back to back, in alternating rounds so that both see the
same machine load, then the service with 8 concurrent clients. Prints queries/s and p50/p99 latency
per request, and the goals: service overhead < 20% over in-process at batch 512 (one client), BM25
> 500 queries/s on one core. BM25 runs with a single search thread (numba's serial kernel), in-process and
in the server (``--threads 1``); it is not pinned with taskset, because on a shared machine a pinned
process waits whenever someone else's job lands on its core.
Figures, not pass/fail: on a shared machine they move with the load (printed with the results).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retrieval_server.build_index import build_index  # noqa: E402
from retrieval_server.launcher import ServerProcess  # noqa: E402
from retrieval_server.manifest import Manifest, ManifestError  # noqa: E402
from retrieval_server.service import load_retriever  # noqa: E402

BATCH_SIZES = (1, 16, 128, 512)
CONCURRENT_CLIENTS = 8
ROUNDS = 3  # in-process and service x1 alternate this many times per batch size
TOPK = 3

# ---------------------------------------------------------------------------------------------------------------
# Synthetic corpus: fictional entities, two sentences each, ~30 words (~45 MiniLM tokens) per passage.

SYLLABLES = ("ar bel cor dan el fen gar hal in jor kel lun mar nor ol pen quin ros sal tor ul vel wen yar zan "
             "bra cle dro fia gri hel isk jun kra lia mor nia opa pra rei sto tha uvi vra wyn xel yor zel").split()
OCCUPATIONS = ("glassmaker weaver astronomer bridge-builder poet cartographer physician merchant sailor painter "
               "composer botanist mason judge teacher brewer clockmaker printer").split()
PRODUCTS = "wool cheese salt timber glass wine copper linen pottery honey iron silk".split()
LANDMARKS = ("old lighthouse", "stone bridge", "market hall", "clock tower", "ruined abbey", "harbour wall",
             "copper mine", "great library", "winter fair", "botanical garden")
ORG_KINDS = "Guild Society Company Academy Brotherhood Trust Observatory Press".split()
WORK_KINDS = ("novel", "atlas", "symphony", "treatise", "ballad", "chronicle", "map", "painting")
EVENTS = ("a great flood", "a long famine", "the comet year", "a border war", "a plague winter", "the salt riots")


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


def _passage(i: int, rng: random.Random) -> dict:
    kind = i % 5
    town, province, river = _name(rng, 2), _name(rng, 3), _name(rng, 2)
    year = rng.randint(1400, 1950)
    if kind == 0:
        title = f"{_name(rng, 2)} {_name(rng, 2)}"
        job = rng.choice(OCCUPATIONS)
        text = (f"{title} was a {job} born in {town} in {year}. {title.split()[0]} settled on the {river} river "
                f"and wrote a {rng.choice(WORK_KINDS)} about {rng.choice(EVENTS)} in {province}.")
    elif kind == 1:
        title = town
        text = (f"{town} is a town in {province} on the {river} river, known for its {rng.choice(PRODUCTS)} "
                f"and its {rng.choice(LANDMARKS)}. It was founded in {year} and suffered {rng.choice(EVENTS)}.")
    elif kind == 2:
        title = f"{river} River"
        text = (f"The {river} is a river of {province} that flows {rng.randint(20, 900)} km from {town} into the "
                f"{_name(rng, 2)} Sea. Its valley is known for {rng.choice(PRODUCTS)} since {year}.")
    elif kind == 3:
        title = f"{_name(rng, 2)} {rng.choice(ORG_KINDS)}"
        text = (f"The {title} is based in {town}, {province}, and was founded in {year} by a "
                f"{rng.choice(OCCUPATIONS)} named {_name(rng, 2)} {_name(rng, 2)} to trade {rng.choice(PRODUCTS)}.")
    else:
        title = f"The {_name(rng, 3)} {rng.choice(WORK_KINDS).capitalize()}"
        text = (f"{title} is a {rng.choice(WORK_KINDS)} completed in {year} by a {rng.choice(OCCUPATIONS)} "
                f"from {town}. It describes {rng.choice(EVENTS)} along the {river} river.")
    return {"id": str(i), "contents": f'"{title}"\n{text}'}


def write_corpus(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for i in range(n):
            f.write(json.dumps(_passage(i, rng)) + "\n")
    tmp.replace(path)


def make_queries(corpus: Path, n: int, seed: int = 1) -> list[str]:
    """Questions about random passages (title + a question pattern), like a policy's searches."""
    rng = random.Random(seed)
    lines = corpus.read_text().splitlines()
    patterns = ("where was {t} born?", "what is {t} known for?", "who founded {t}?", "which river flows past {t}?",
                "when was {t} completed", "{t} history and trade")
    queries = []
    for _ in range(n):
        title = json.loads(rng.choice(lines))["contents"].split("\n")[0].strip('"')
        queries.append(rng.choice(patterns).format(t=title))
    return queries


# ---------------------------------------------------------------------------------------------------------------
# Index cache


def ensure_indexes(data: Path, n_passages: int, names: list[str]) -> Path:
    data.mkdir(parents=True, exist_ok=True)
    corpus = data / "corpus.jsonl"
    if not corpus.exists() or _count_lines(corpus) != n_passages:
        print(f"writing a synthetic corpus of {n_passages} passages to {corpus}", flush=True)
        write_corpus(corpus, n_passages)
        for stale in data.glob("index_*"):
            shutil.rmtree(stale)
    builds = {"bm25": dict(retriever="bm25"), "dense-flat": dict(retriever="dense", index="flat"),
              "dense-hnsw": dict(retriever="dense", index="hnsw", from_flat=data / "index_dense-flat")}
    needed = set(names) | ({"dense-flat"} if "dense-hnsw" in names else set())
    for name in ("bm25", "dense-flat", "dense-hnsw"):
        if name in needed and not _index_ok(data / f"index_{name}", n_passages):
            print(f"building {name} index (cached in {data}/index_{name})", flush=True)
            start = time.perf_counter()
            build_index(corpus, data / f"index_{name}", **builds[name])
            print(f"  built in {time.perf_counter() - start:.0f}s", flush=True)
    return corpus


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _index_ok(index_dir: Path, n_passages: int) -> bool:
    try:
        return Manifest.load(index_dir).count == n_passages
    except ManifestError:
        return False


# ---------------------------------------------------------------------------------------------------------------
# Measurement


@dataclass
class Figures:
    retriever: str
    mode: str
    batch: int
    requests: int
    queries_per_s: float
    p50_ms: float
    p99_ms: float


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _figures(name: str, mode: str, batch: int, latencies: list[float], n_queries: int, wall: float) -> Figures:
    return Figures(name, mode, batch, len(latencies), n_queries / wall, 1000 * statistics.median(latencies),
                   1000 * _percentile(latencies, 0.99))


def requests_for(batch: int, scale: float) -> int:
    """Requests per measurement: ~4096 queries, between 8 and 50 requests (scaled by --scale)."""
    return max(ROUNDS, round(scale * min(50, max(8, 4096 // batch))))


def _chunk(queries: list[str], r: int, batch: int) -> list[str]:
    start = (r * batch) % (len(queries) - batch + 1)
    return queries[start:start + batch]


def measure_in_process(retriever, queries: list[str], batch: int, n: int) -> tuple[list[float], float]:
    """``n`` calls of ``retriever.search`` (encode + search) back to back: per-call latencies and wall time."""
    latencies = []
    for r in range(n):
        chunk = _chunk(queries, r, batch)
        start = time.perf_counter()
        retriever.search(chunk, TOPK)
        latencies.append(time.perf_counter() - start)
    return latencies, sum(latencies)


def _client_loop(url: str, queries: list[str], batch: int, n: int, offset: int, latencies: list[float]) -> None:
    with httpx.Client(timeout=600) as client:
        for r in range(n):
            chunk = _chunk(queries, offset + r, batch)
            start = time.perf_counter()
            response = client.post(url + "/retrieve", json={"queries": chunk, "topk": TOPK})
            response.raise_for_status()
            assert len(response.json()["result"]) == batch
            latencies.append(time.perf_counter() - start)


def measure_service(url: str, queries: list[str], batch: int, n: int, clients: int) -> tuple[list[float], float]:
    """``clients`` threads, each sending ``n`` requests back to back: all latencies and the wall time."""
    per_client: list[list[float]] = [[] for _ in range(clients)]
    threads = [threading.Thread(target=_client_loop, args=(url, queries, batch, n, 97 * c, per_client[c]))
               for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for lat in per_client for x in lat], time.perf_counter() - start


def bench_retriever(name: str, retriever, server: ServerProcess, queries: list[str], scale: float) -> list[Figures]:
    """Per batch size: in-process and service x1 in alternating rounds (so that both see the same machine
    load, which moves a lot on a shared machine), then service x8."""
    out = []
    for batch in BATCH_SIZES:
        retriever.search(queries[:batch], TOPK)  # warm-up
        _client_loop(server.url, queries, batch, 1, 0, [])
        n = requests_for(batch, scale)
        local: tuple[list[float], float] = ([], 0.0)
        served: tuple[list[float], float] = ([], 0.0)
        for round_ in range(ROUNDS):
            count = n // ROUNDS + (round_ < n % ROUNDS)
            lat, wall = measure_in_process(retriever, queries, batch, count)
            local = (local[0] + lat, local[1] + wall)
            lat, wall = measure_service(server.url, queries, batch, count, clients=1)
            served = (served[0] + lat, served[1] + wall)
        out.append(_figures(name, "in-process", batch, local[0], batch * len(local[0]), local[1]))
        out.append(_figures(name, "service x1", batch, served[0], batch * len(served[0]), served[1]))
        latencies, wall = measure_service(server.url, queries, batch, max(2, n // 4), CONCURRENT_CLIENTS)
        out.append(_figures(name, f"service x{CONCURRENT_CLIENTS}", batch, latencies, batch * len(latencies), wall))
        for f in out[-3:]:
            print(_row(f), flush=True)
    return out


HEADER = f"{'retriever':<11} {'mode':<12} {'batch':>5} {'req':>4} {'queries/s':>10} {'p50 ms':>9} {'p99 ms':>9}"


def _row(f: Figures) -> str:
    return (f"{f.retriever:<11} {f.mode:<12} {f.batch:>5} {f.requests:>4} {f.queries_per_s:>10.1f} "
            f"{f.p50_ms:>9.1f} {f.p99_ms:>9.1f}")


def run_retriever(name: str, data: Path, corpus: Path, queries: list[str], scale: float,
                  dense_threads: int) -> list[Figures]:
    """BM25 runs with one search thread (numba serial kernel), in-process and in the server."""
    index_dir = data / f"index_{name}"
    threads = 1 if name == "bm25" else dense_threads
    args = ["--threads", str(threads), "--topk", str(TOPK), "--max-queries", "1024"]
    retriever = load_retriever(index_dir, Manifest.load(index_dir), threads=threads)
    with ServerProcess(index_dir, corpus, args) as server:
        server.wait_ready(timeout=900)
        return bench_retriever(name, retriever, server, queries, scale)


def summarise(figures: list[Figures]) -> None:
    print("\nGoals")
    by_key = {(f.retriever, f.mode, f.batch): f for f in figures}
    for name in dict.fromkeys(f.retriever for f in figures):
        local, served = by_key.get((name, "in-process", 512)), by_key.get((name, "service x1", 512))
        if local and served:
            by_median = 100 * (served.p50_ms / local.p50_ms - 1)
            by_throughput = 100 * (local.queries_per_s / served.queries_per_s - 1)
            print(f"  {name}: service overhead at batch 512 = {by_median:+.1f}% on median latency "
                  f"({served.p50_ms:.0f} vs {local.p50_ms:.0f} ms), {by_throughput:+.1f}% on throughput "
                  f"({served.queries_per_s:.0f} vs {local.queries_per_s:.0f} queries/s); goal < 20%")
    bm25 = [f for f in figures if f.retriever == "bm25" and f.mode != "in-process"]
    if bm25:
        best = max(bm25, key=lambda f: f.queries_per_s)
        print(f"  bm25 on one core: best {best.queries_per_s:.0f} queries/s through the service ({best.mode}, "
              f"batch {best.batch}); goal > 500")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "bench")
    p.add_argument("--retrievers", default="dense-flat,dense-hnsw,bm25")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the number of requests per measurement")
    p.add_argument("--dense-threads", type=int, default=0,
                   help="CPU threads of the dense retrievers, in-process and served (0: torch/FAISS default)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the server subprocess on kill, too
    names = args.retrievers.split(",")
    corpus = ensure_indexes(args.data, args.passages, names)
    queries = make_queries(corpus, 4096)
    print(f"\n{args.passages} passages, top-{TOPK}, {os.cpu_count()} CPUs, dense threads "
          f"{args.dense_threads or 'default'}, load average {os.getloadavg()[0]:.1f} at start\n{HEADER}", flush=True)
    figures = []
    for name in names:
        figures += run_retriever(name, args.data, corpus, queries, args.scale, args.dense_threads)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end\n{HEADER}")
    for f in figures:
        print(_row(f))
    summarise(figures)


if __name__ == "__main__":
    main()
