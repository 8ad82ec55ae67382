"""Retrieval speed and memory: encoder dtypes, the service at batch 1-512, a GRPO-like load with and without
the query cache, resident memory at 100k and 1M passages, and the service's overhead over in-process search.

    python benchmarks/bench_retrieval.py                                  # parts encoder,service,grpo,rss
    git worktree add /tmp/base <older commit>                             # optional: today's code as baseline
    python benchmarks/bench_retrieval.py --baseline-src /tmp/base         # ... measured side by side
    python benchmarks/bench_retrieval.py --parts overhead                 # in-process vs service, 3 retrievers
    python benchmarks/bench_retrieval.py --parts startup --passages 2000 --baseline-src /tmp/base  # start-up

Parts (``--parts``, comma-separated):
- ``encoder``: the query encoder alone, in-process, per dtype and backend (CPU: fp32 in torch and in ONNX
  Runtime, bf16; GPU: fp32, fp16, bf16):
  queries/s at batch 1/16/128/512 and top-1 agreement with fp32 (exact inner-product search over the
  corpus vectors, in torch) on the benchmark's queries. Needs no FAISS, so it runs on a GPU machine too.
- ``service``: one client, distinct queries, the service with ``--encoder-dtype fp32`` in torch and (CPU) in ONNX
  Runtime and, on a CPU with bf16 instructions, ``bf16`` (cache off) and, with ``--baseline-src``, the server
  of another checkout: queries/s, p50/p99 per request.
- ``grpo``: a GRPO-like load: each request holds 100 prompts' queries 5 times each (n=5), and half of
  each request's prompts were already asked in earlier requests. The service with its defaults (query
  cache on), with ``--cache-size 0`` (deduplication inside a request only), and the baseline.
- ``rss``: the server's resident memory (private and file-backed) once ready and after searches, at 100k
  passages (our build) and 1M (``retrieval_corpus.ensure_tiled``, imported with ``import_index``); the
  baseline serves the same vectors at both sizes.
- ``overhead``: the in-process ``retriever.search`` against the service (1 and 8 clients) for dense flat,
  dense HNSW and BM25 (BM25 on one search thread).
- ``startup``: seconds from ``python -m retrieval_server.serve`` to a ready /health, and the CPU seconds the server
  process used by then, for the dense flat index: the default (which serves from the encoder's cached ONNX bundle
  where one exists, without torch), ``--encoder-backend torch``, and the baseline's default; 5 alternating rounds,
  after one start of each that warms the page cache and makes the bundle.
Servers run side by side and are measured in alternating rounds, so that all see the same machine load
(which moves a lot on a shared machine; the load average is printed). Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from retrieval_corpus import ensure_indexes, ensure_tiled, make_queries  # noqa: E402
from suite_cpu import read_stat  # noqa: E402

from retrieval_server.launcher import ServerProcess  # noqa: E402

BATCH_SIZES = (1, 16, 128, 512)
ROUNDS = 3
TOPK = 3
N_QUERIES = 2048
GRPO_PROMPTS, GRPO_N, GRPO_REQUESTS, GRPO_REPEAT = 100, 5, 12, 0.5
PARTS = ("encoder", "service", "grpo", "rss", "overhead", "startup")


@dataclass
class Figures:
    name: str
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


HEADER = f"{'config':<14} {'mode':<12} {'batch':>5} {'req':>4} {'queries/s':>10} {'p50 ms':>9} {'p99 ms':>9}"


def _row(f: Figures) -> str:
    return (f"{f.name:<14} {f.mode:<12} {f.batch:>5} {f.requests:>4} {f.queries_per_s:>10.1f} "
            f"{f.p50_ms:>9.1f} {f.p99_ms:>9.1f}")


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def requests_for(batch: int, scale: float) -> int:
    """Requests per measurement: ~2048 queries, between 4 and 100 requests (scaled by --scale)."""
    return max(ROUNDS, round(scale * min(100, max(4, 2048 // batch))))


def _chunk(queries: list[str], r: int, batch: int) -> list[str]:
    start = (r * batch) % (len(queries) - batch + 1)
    return queries[start:start + batch]


def _timed_posts(url: str, batches: list[list[str]], latencies: list[float]) -> None:
    with httpx.Client(timeout=900) as client:
        for queries in batches:
            start = time.perf_counter()
            response = client.post(url + "/retrieve", json={"queries": queries, "topk": TOPK})
            response.raise_for_status()
            assert len(response.json()["result"]) == len(queries)
            latencies.append(time.perf_counter() - start)


def measure_service(url: str, batches_per_client: list[list[list[str]]]) -> tuple[list[float], float]:
    """One thread per client, each sending its batches back to back: all latencies and the wall time."""
    per_client: list[list[float]] = [[] for _ in batches_per_client]
    threads = [threading.Thread(target=_timed_posts, args=(url, batches, lat))
               for batches, lat in zip(batches_per_client, per_client, strict=True)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for lat in per_client for x in lat], time.perf_counter() - start


def _alternate(servers: dict[str, ServerProcess], batches: list[list[str]], mode: str, batch: int) -> list[Figures]:
    """Each server gets ``batches`` back to back from one client (kept connected), in ROUNDS rounds taken in turn
    by the servers; queries/s = queries / summed latency."""
    latencies: dict[str, list[float]] = {name: [] for name in servers}
    with ExitStack() as stack:
        clients = {name: stack.enter_context(httpx.Client(base_url=server.url, timeout=900))
                   for name, server in servers.items()}
        for r in range(ROUNDS):
            for name, client in clients.items():
                for queries in batches[r::ROUNDS]:
                    start = time.perf_counter()
                    response = client.post("/retrieve", json={"queries": queries, "topk": TOPK})
                    response.raise_for_status()
                    latencies[name].append(time.perf_counter() - start)
    n_queries = sum(map(len, batches))
    return [_figures(name, mode, batch, lat, n_queries, sum(lat)) for name, lat in latencies.items()]


def start_servers(stack: ExitStack, index_dir: Path, corpus: Path, configs: dict[str, list[str]],
                  baseline: Path | None, threads: int) -> dict[str, ServerProcess]:
    """``configs``: name -> extra server args; with ``baseline``, a ``today`` server of that checkout first."""
    common = ["--threads", str(threads), "--topk", str(TOPK), "--max-queries", "1024"]
    servers = {}
    if baseline is not None:
        servers["today"] = stack.enter_context(ServerProcess(index_dir, corpus, common, source=baseline))
    for name, args in configs.items():
        servers[name] = stack.enter_context(ServerProcess(index_dir, corpus, [*common, *args]))
    for name, server in servers.items():
        health = server.wait_ready(timeout=1800)
        print(f"  {name}: encoder {health.get('encoder_dtype', 'fp32 (today)')} "
              f"{health.get('encoder_backend', 'torch')}, cache {health.get('cache_size', 0)}", flush=True)
    return servers


# ---------------------------------------------------------------------------------------------------------------
# Parts


def part_encoder(data: Path, corpus: Path, queries: list[str], args: argparse.Namespace) -> list[str]:
    """Encoder throughput per dtype (batches of ``_chunk``, their number scaled by ``--scale``) and top-1 agreement
    with fp32 on all ``queries`` (exact search over the corpus vectors)."""
    import torch

    from retrieval_server.index.encoder import DEFAULT_MODEL, Encoder

    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    fp32 = Encoder(DEFAULT_MODEL, dtype="fp32", batch_size=512, backend="torch")
    if (data / "index_dense-flat").exists():
        from retrieval_server.index.dense import read_index
        from retrieval_server.index.manifest import Manifest

        flat = read_index(Manifest.load(data / "index_dense-flat").index_path(data / "index_dense-flat"))
        passages = torch.from_numpy(flat.reconstruct_n(0, flat.ntotal))  # [N, dim]
    else:  # no FAISS index here (GPU machine): encode the corpus
        from retrieval_server.index.corpus import iter_passages

        passages = torch.from_numpy(fp32.encode_passages(list(iter_passages(corpus))))
    passages = passages.to(device)

    def top1(vectors) -> torch.Tensor:
        q = torch.from_numpy(vectors).to(device)  # [B, dim]
        return torch.cat([(q[i:i + 256] @ passages.T).argmax(dim=1) for i in range(0, len(q), 256)]).cpu()

    reference = top1(fp32.encode_queries(queries))
    lines = []
    variants = [("fp32", "torch"), ("fp16", "torch"), ("bf16", "torch")] if on_gpu else \
        [("fp32", "torch"), ("fp32", "onnx"), ("bf16", "torch")]
    for dtype, backend in variants:
        encoder = fp32 if (dtype, backend) == ("fp32", "torch") else \
            Encoder(DEFAULT_MODEL, dtype=dtype, batch_size=512, backend=backend)
        agreement = float((top1(encoder.encode_queries(queries)) == reference).float().mean())
        rates = []
        for batch in BATCH_SIZES:
            chunks = [_chunk(queries, r, batch) for r in range(max(3, round(args.scale * min(50, 1024 // batch))))]
            for chunk in chunks if on_gpu else chunks[:1]:  # warm-up; on GPU every shape (cuBLAS picks per shape)
                encoder.encode_queries(chunk)
            start = time.perf_counter()
            for chunk in chunks:
                encoder.encode_queries(chunk)  # returns numpy: synchronised
            rates.append(len(chunks) * batch / (time.perf_counter() - start))
        line = (f"  {device} {dtype:<5} {backend:<5} top-1 agreement with fp32 {100 * agreement:6.2f}% | "
                "queries/s at batch "
                + " / ".join(f"{b}: {r:.0f}" for b, r in zip(BATCH_SIZES, rates, strict=True)))
        print(line, flush=True)
        lines.append(line)
    return lines


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def part_service(data: Path, corpus: Path, queries: list[str], args: argparse.Namespace) -> list[Figures]:
    from retrieval_server.index.encoder import cpu_has_bf16

    configs = {"fp32 torch": ["--encoder-dtype", "fp32", "--encoder-backend", "torch", "--cache-size", "0"]}
    if not torch_cuda_available():
        configs["fp32 onnx"] = ["--encoder-dtype", "fp32", "--encoder-backend", "onnx", "--cache-size", "0"]
    if cpu_has_bf16():  # emulated bf16 is many times slower than fp32 (the encoder part shows by how much)
        configs["bf16"] = ["--encoder-dtype", "bf16", "--cache-size", "0"]
    figures = []
    with ExitStack() as stack:
        servers = start_servers(stack, data / "index_dense-flat", corpus, configs, args.baseline_src, args.threads)
        for batch in BATCH_SIZES:
            for server in servers.values():
                measure_service(server.url, [[queries[:batch]]])  # warm-up
            n = requests_for(batch, args.scale)
            figures += _alternate(servers, [_chunk(queries, r, batch) for r in range(n)], "service x1", batch)
            for f in figures[-len(servers):]:
                print(_row(f), flush=True)
    return figures


def grpo_requests(queries: list[str], seed: int = 2) -> list[list[str]]:
    """GRPO_REQUESTS requests of GRPO_PROMPTS prompts x GRPO_N copies of each prompt's query (shuffled); a
    GRPO_REPEAT fraction of each request's prompts were asked before (a later epoch, validation)."""
    rng = random.Random(seed)
    fresh = iter(queries)
    asked: list[str] = []
    requests = []
    for _ in range(GRPO_REQUESTS):
        n_old = round(GRPO_REPEAT * GRPO_PROMPTS) if asked else 0
        prompts = rng.sample(asked, min(n_old, len(asked))) + [next(fresh) for _ in range(GRPO_PROMPTS - n_old)]
        asked += prompts[n_old:]
        batch = [q for q in prompts for _ in range(GRPO_N)]  # [GRPO_PROMPTS * GRPO_N]
        rng.shuffle(batch)
        requests.append(batch)
    return requests


def part_grpo(data: Path, corpus: Path, queries: list[str], args: argparse.Namespace) -> list[Figures]:
    configs = {"cache": [], "dedupe only": ["--cache-size", "0"]}
    requests = grpo_requests(queries)
    with ExitStack() as stack:
        servers = start_servers(stack, data / "index_dense-flat", corpus, configs, args.baseline_src, args.threads)
        figures = _alternate(servers, requests, "grpo x1", GRPO_PROMPTS * GRPO_N)
        for f in figures:
            print(_row(f), flush=True)
        for name, server in servers.items():
            if name != "today":
                print(f"  {name} /stats: {httpx.get(server.url + '/stats').json()}", flush=True)
    return figures


def _serve_and_measure(index_dir: Path, corpus: Path, args: list[str], queries: list[str],
                       source: Path | None = None) -> tuple[float, dict, dict]:
    """Seconds to ready, and the server's memory once ready and after 40 requests of 16 queries."""
    start = time.perf_counter()
    with ServerProcess(index_dir, corpus, args, source=source) as server:
        server.wait_ready(timeout=1800)
        ready_s, ready = time.perf_counter() - start, server.memory()
        measure_service(server.url, [[_chunk(queries, r, 16) for r in range(40)]])
        return ready_s, ready, server.memory()


def part_startup(data: Path, corpus: Path, queries: list[str], args: argparse.Namespace) -> list[str]:
    configs = {"default": ([], None), "torch": (["--encoder-backend", "torch"], None)}
    if args.baseline_src is not None:
        configs["today"] = ([], args.baseline_src)
    common = ["--threads", str(args.threads), "--topk", str(TOPK)]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    for round_ in range(6):  # round 0 warms the page cache and exports the bundle; not counted
        for name, (extra, source) in configs.items():
            start = time.perf_counter()
            with ServerProcess(data / "index_dense-flat", corpus, [*common, *extra], source=source) as server:
                health = server.wait_ready(timeout=600)
                ready_s = time.perf_counter() - start
                cpu_s = read_stat(str(server.proc.pid))[0] / os.sysconf("SC_CLK_TCK")  # the server's, so far
            if round_:
                times[name].append((ready_s, cpu_s))
            else:
                print(f"  {name}: encoder backend {health.get('encoder_backend', '?')}", flush=True)
    lines = []
    for name, got in times.items():
        ready, cpu = sorted(t for t, _ in got), sorted(c for _, c in got)
        lines.append(f"start-up {name:8s}: ready in {statistics.median(ready):5.2f} s (range {ready[0]:.2f}-"
                     f"{ready[-1]:.2f}), server CPU {statistics.median(cpu):5.2f} s (median of {len(got)})")
    return lines


def part_rss(data: Path, corpus: Path, queries: list[str], args: argparse.Namespace) -> list[str]:
    from retrieval_server.index.import_faiss import import_index
    from retrieval_server.index.manifest import INDEX_FILE, Manifest

    n = Manifest.load(data / "index_dense-flat").count
    tiled_corpus, tiled_faiss = ensure_tiled(data, copies=10)
    imported = data / f"index_import_{10 * n}"
    if not (imported / "manifest.json").exists():
        print(f"importing {tiled_faiss} (import_index, sample check on)", flush=True)
        start = time.perf_counter()
        import_index(tiled_faiss, tiled_corpus, imported)
        print(f"  imported in {time.perf_counter() - start:.0f}s", flush=True)
    cases = [(n, data / "index_dense-flat", corpus, data / "index_dense-flat" / INDEX_FILE),
             (10 * n, imported, tiled_corpus, tiled_faiss)]
    _serve_and_measure(data / "index_dense-flat", corpus, ["--threads", str(args.threads)], queries)  # warm disk cache
    lines = [f"{'passages':<9} {'server':<6} {'index MiB':>9} {'ready s':>8} | MiB once ready: VmRSS RssAnon RssFile"
             " | after 40 x 16 queries: VmRSS RssAnon RssFile VmHWM"]
    print(lines[0], flush=True)
    for size, index_dir, case_corpus, faiss_file in cases:
        runs = [("ours", index_dir, None)]
        if args.baseline_src is not None:  # a version-1 index directory (the baseline reads no other) on the same file
            v1 = data / f"index_v1_{size}"
            v1.mkdir(exist_ok=True)
            if not (v1 / INDEX_FILE).exists():
                (v1 / INDEX_FILE).symlink_to(faiss_file.resolve())
            manifest = Manifest.load(index_dir)
            manifest.index_file = manifest.index_bytes = None
            manifest.save(v1)
            runs.append(("today", v1, args.baseline_src))
        for name, run_dir, source in runs:
            extra = [] if source else ["--encoder-dtype", "fp32"]
            ready_s, ready, after = _serve_and_measure(run_dir, case_corpus, ["--threads", str(args.threads), *extra],
                                                       queries, source)
            line = (f"{size:<9,} {name:<6} {faiss_file.stat().st_size / 2**20:>9.0f} {ready_s:>8.1f} | "
                    f"{ready['VmRSS']:>20} {ready['RssAnon']:>7} {ready['RssFile']:>7} | "
                    f"{after['VmRSS']:>28} {after['RssAnon']:>7} {after['RssFile']:>7} {after['VmHWM']:>5}")
            print(line, flush=True)
            lines.append(line)
    return lines


def part_overhead(data: Path, corpus: Path, queries: list[str], args: argparse.Namespace) -> list[Figures]:
    """In-process ``retriever.search`` vs the service (x1 alternating, then x8) per retriever, cache off."""
    from retrieval_server.index.manifest import Manifest
    from retrieval_server.search.service import ServeOptions, load_retriever

    figures = []
    for name in ("dense-flat", "dense-hnsw", "bm25"):
        threads = 1 if name == "bm25" else args.threads
        index_dir = data / f"index_{name}"
        options = ServeOptions(threads=threads, encoder_dtype="fp32", cache_size=0)
        retriever = load_retriever(index_dir, Manifest.load(index_dir), options)
        server_args = ["--threads", str(threads), "--topk", str(TOPK), "--max-queries", "1024",
                       "--encoder-dtype", "fp32", "--cache-size", "0"]
        with ServerProcess(index_dir, corpus, server_args) as server:
            server.wait_ready(timeout=1800)
            for batch in BATCH_SIZES:
                retriever.search(queries[:batch], TOPK)
                measure_service(server.url, [[queries[:batch]]])
                n = requests_for(batch, args.scale)
                local, served = ([], 0.0), ([], 0.0)
                for r in range(ROUNDS):
                    chunks = [_chunk(queries, i, batch) for i in range(r, n, ROUNDS)]
                    lat = []
                    for chunk in chunks:
                        start = time.perf_counter()
                        retriever.search(chunk, TOPK)
                        lat.append(time.perf_counter() - start)
                    local = (local[0] + lat, local[1] + sum(lat))
                    lat, wall = measure_service(server.url, [chunks])
                    served = (served[0] + lat, served[1] + wall)
                figures.append(_figures(name, "in-process", batch, local[0], batch * len(local[0]), local[1]))
                figures.append(_figures(name, "service x1", batch, served[0], batch * len(served[0]), served[1]))
                per_client = [[_chunk(queries, 97 * c + r, batch) for r in range(max(2, n // 4))] for c in range(8)]
                lat, wall = measure_service(server.url, per_client)
                figures.append(_figures(name, "service x8", batch, lat, batch * len(lat), wall))
                for f in figures[-3:]:
                    print(_row(f), flush=True)
    return figures


# ---------------------------------------------------------------------------------------------------------------


def summarise(figures: list[Figures]) -> list[str]:
    by_key = {(f.name, f.mode, f.batch): f for f in figures}
    lines = []
    for batch in (1, 512):
        today = by_key.get(("today", "service x1", batch))
        if today is None:
            continue
        ratios = [f"{name} {f.queries_per_s / today.queries_per_s:.2f}x" for name in ("fp32 torch", "fp32 onnx", "bf16")
                  if (f := by_key.get((name, "service x1", batch)))]
        lines.append(f"dense flat, batch {batch}, throughput over today's: {', '.join(ratios)}; goal >= 2x")
    grpo = {f.name: f for f in figures if f.mode == "grpo x1"}
    if "today" in grpo:
        lines += [f"GRPO-like load: {name} {grpo[name].queries_per_s / grpo['today'].queries_per_s:.2f}x today's "
                  "throughput; goal >= 4x" for name in ("cache", "dedupe only")]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="encoder,service,grpo,rss", help=f"comma-separated, of {PARTS}")
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "bench")
    p.add_argument("--baseline-src", type=Path, default=None,
                   help="a checkout of this project (e.g. `git worktree add /tmp/base COMMIT`) whose server is "
                        "measured as 'today' beside this one")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the number of requests per measurement")
    p.add_argument("--threads", type=int, default=0, help="CPU threads of the servers (0: torch/FAISS default)")
    args = p.parse_args()
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        p.error(f"--parts must be a comma-separated subset of {PARTS}, got {args.parts!r}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the server subprocesses on kill, too
    needed = ["dense-flat"] + (["dense-hnsw", "bm25"] if "overhead" in parts else [])
    if parts == ["encoder"] and not (args.data / "index_dense-flat").exists():
        needed = []  # e.g. a GPU machine without FAISS: the encoder part encodes the corpus itself
    corpus = ensure_indexes(args.data, args.passages, needed)
    queries = make_queries(corpus, N_QUERIES)
    print(f"\n{args.passages} passages, top-{TOPK}, {os.cpu_count()} CPUs, server threads {args.threads or 'default'}, "
          f"{_load()} at start", flush=True)
    figures, notes = [], []
    if "encoder" in parts:
        print("\nencoder alone, in-process", flush=True)
        notes += part_encoder(args.data, corpus, queries, args)
    for name, part in (("service", part_service), ("grpo", part_grpo), ("overhead", part_overhead)):
        if name in parts:
            print(f"\n{name}\n{HEADER}", flush=True)
            figures += part(args.data, corpus, queries, args)
    if "rss" in parts:
        print("\nresident memory of the server (MiB)", flush=True)
        notes += part_rss(args.data, corpus, queries, args)
    if "startup" in parts:
        print("\nstart-up of the dense service", flush=True)
        notes += part_startup(args.data, corpus, queries, args)
    print(f"\n{_load()} at the end\n{HEADER}")
    for f in figures:
        print(_row(f))
    for line in notes + summarise(figures):
        print(line)


if __name__ == "__main__":
    main()
