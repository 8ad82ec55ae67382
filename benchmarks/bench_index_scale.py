"""Index kinds at millions of vectors: bytes per vector, resident memory, build time, queries/s, recall; shards.

    python benchmarks/bench_index_scale.py [--vectors 2000000] [--real 100000] [--model local|mixture]
                                           [--kinds flat,sq8,...] [--target-recall 0.99] [--shards 1,2,3]
                                           [--parts kinds,shards,projection] [--reuse]

The vectors (``--vectors`` rows, dimension 384, the bundled all-MiniLM-L6-v2):
- ``--real`` of them are real encodings: the flat index of the synthetic-text corpus of ``retrieval_corpus.py``
  (built and cached under ``--data`` on first use: ~12 min at 100k passages on this machine's 2 cores);
- the rest are samples of a model fitted to those encodings (``--model``: ``local``, real vectors moved within
  their own neighbourhoods, or the first model, ``mixture`` of low-rank Gaussians; ``synthetic_vectors.py`` says
  how and why ``local`` replaced it), because encoding millions of passages does not fit the time.
  The real rows are spread evenly through the file (every ``vectors / real``-th row), so an index trained on
  the first rows sees both. Cached as a raw float32 file under ``--data/scale_<N>/`` with the recipe in
  ``meta.json``.
- Queries are real too: questions about random passages of the corpus (``retrieval_corpus.make_queries``),
  encoded by the query encoder; 1000 tune an index's search parameter (the smallest that reaches
  ``--target-recall`` at recall@3 on them, ``retrieval_server.index.tuning``), 1000 others measure it. The profile
  printed first compares those queries' best scores over the real vectors and over as many sampled ones.

Part ``kinds``: per index kind (``KIND[:M<links>][+REFINE]``: ``hnswsq8:M8+fp32`` is hnswsq8 with 8 links per node
instead of its default, refined by an fp32 store), built from the cached vectors by ``retrieval_server.index.dense``
(the code ``build_index`` runs), written to ``--out``, then measured in a fresh process per mode: read into memory (so
the resident memory is the index's), memory-mapped (as the service loads it: private and file-backed memory apart), and
for a refined kind ``cold`` (memory-mapped after the file is dropped from the page cache, only the base index warmed up:
the refine store is read from disk while timed, and the memory is what searching needs, not what the page cache happened
to hold). Figures: bytes per vector (file size / rows), resident memory added by the index (VmRSS after loading and
searching minus before), build seconds (training included), queries/s at batch 512 (the 1000 measuring queries) and
batch 1 (200 of them) for top-3 (the service's default), recall@3 and @10 against exact search (each from a search for
that many results). ``--reuse`` tunes and measures again the indexes an earlier run built in ``--out`` (their build time
and parameters are kept beside each index), e.g. to measure on an idle machine what was built beside other work, or
after a change to the tuning. Part ``shards``: the flat index split in 1, 2 and 3 row-range shards (``import_index
--shards``), each served by its own ``retrieval_server.serve`` process, queried through the multi-endpoint client (which
fans out and merges): queries/s at batch 512 end to end, encoder included; the top-3 must equal the unsharded one. Part
``projection``: the arithmetic from the measured figures to 21M passages of dimension 768 on 1 and 4 nodes, printed with
its assumptions. Figures, not pass/fail. """

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from retrieval_corpus import ensure_indexes, make_queries  # noqa: E402
from synthetic_vectors import (  # noqa: E402
    calibrate,
    fit_mixture,
    neighbour_profile,
    real_neighbours,
    sample_batches,
    sample_local,
)

# each optionally +REFINE (ivfpq+fp16)
KINDS = ("flat", "sq8", "fp16", "ivf", "ivfsq8", "ivfpq", "opq", "hnsw", "hnswsq8", "hnswsq6", "pcahnswsq8")
TOP_OF_LADDER = {"ivf": {"nprobe": 256}, "ivfsq8": {"nprobe": 256}, "ivfpq": {"nprobe": 256}, "opq": {"nprobe": 256},
                 "hnsw": {"efSearch": 1024}, "hnswsq8": {"efSearch": 1024},
                 "hnswsq6": {"efSearch": 1024}, "pcahnswsq8": {"efSearch": 1024}}
N_TUNE, N_EVAL, N_BATCH1 = 1000, 1000, 200
BATCH = 512
TARGET_N, TARGET_DIM = 21_000_000, 768  # wiki-18 with e5-base
CHUNK = 262_144  # rows per streamed batch


# ---------------------------------------------------------------- data
def real_vectors(data: Path, n_real: int) -> tuple[np.ndarray, Path]:
    """The flat index's vectors of the ``n_real``-passage benchmark corpus ``[n_real, 384]``, and the corpus."""
    from retrieval_server.index.dense import read_index
    from retrieval_server.index.manifest import Manifest

    corpus = ensure_indexes(data, n_real, ["dense-flat"])
    index_dir = data / "index_dense-flat"
    flat = read_index(Manifest.load(index_dir).index_path(index_dir))
    return flat.reconstruct_n(0, flat.ntotal), corpus


def encode_queries(data: Path, corpus: Path, n: int) -> np.ndarray:
    """``n`` benchmark questions encoded by the index's query encoder ``[n, dim]`` (cached)."""
    path = data / f"queries_{n}.npy"
    if path.exists():
        return np.load(path)
    from retrieval_server.index.encoder import Encoder
    from retrieval_server.index.manifest import Manifest

    manifest = Manifest.load(data / "index_dense-flat")
    encoder = Encoder(manifest.model, manifest.query_prefix, manifest.passage_prefix)
    vectors = encoder.encode_queries(make_queries(corpus, n, seed=7)).astype(np.float32)
    np.save(path, vectors)
    return vectors


def scale_vectors(data: Path, n: int, real: np.ndarray, model: str, seed: int = 0) -> np.ndarray:
    """The ``[n, dim]`` float32 benchmark vectors of ``model`` (``local`` or ``mixture``, ``synthetic_vectors``):
    the real rows spread evenly among samples; memory-mapped, built on first use."""
    out = data / (f"scale_{n}" if model == "mixture" else f"scale_{n}_{model}")
    meta = {"rows": n, "real_rows": len(real), "dim": real.shape[1], "seed": seed, "model": model,
            "real_source": "retrieval_corpus.ensure_indexes flat index (all-MiniLM-L6-v2)",
            "real_stride": n // len(real)}
    meta.update({"clusters": 256, "rank": 16} if model == "mixture" else {"neighbours": 10})
    path = out / "vectors.f32"
    if path.exists() and (out / "meta.json").exists():
        recorded = json.loads((out / "meta.json").read_text())
        if {k: recorded.get(k) for k in meta} == {**meta, "model": recorded.get("model", "mixture")}:
            return np.memmap(path, np.float32, "r", shape=(n, real.shape[1]))
    from tqdm import tqdm

    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)
    if model == "mixture":
        print(f"fitting a mixture of {meta['clusters']} rank-{meta['rank']} Gaussians to {len(real)} real vectors",
              flush=True)
        samples = sample_batches(fit_mixture(real, meta["clusters"], meta["rank"], seed), n, seed + 1)
    else:
        neighbours = real_neighbours(real, meta["neighbours"])
        fit = calibrate(real, neighbours, seed=seed)
        print(f"local model, {meta['neighbours']} neighbours: {json.dumps({k: round(v, 4) for k, v in fit.items()})}",
              flush=True)
        meta["bandwidth"] = fit["bandwidth"]
        samples = sample_local(real, neighbours, n, fit["bandwidth"], seed + 1)
    vectors = np.memmap(path, np.float32, "w+", shape=(n, real.shape[1]))
    with tqdm(total=n, desc="sample", unit="vector") as bar:
        start = 0
        for batch in samples:
            vectors[start:start + len(batch)] = batch
            start += len(batch)
            bar.update(len(batch))
    vectors[np.arange(len(real)) * meta["real_stride"]] = real  # real rows spread evenly
    vectors.flush()
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return np.memmap(path, np.float32, "r", shape=(n, real.shape[1]))


def batches(vectors: np.ndarray, size: int = CHUNK):
    for start in range(0, len(vectors), size):
        yield np.ascontiguousarray(vectors[start:start + size])


def exact_topk(vectors: np.ndarray, queries: np.ndarray, k: int, cache: Path) -> np.ndarray:
    """Row ids ``[q, k]`` of the exact inner-product top-k (ties by row id), streamed over ``vectors``."""
    if cache.exists():
        return np.load(cache)
    from retrieval_server.index.tuning import StreamingTopK

    top = StreamingTopK(queries, k)
    for batch in batches(vectors, 65536):  # [q, 65536] scores per step
        top.add(batch)
    ids = top.result()[1]
    np.save(cache, ids)
    return ids


# ---------------------------------------------------------------- measuring one index (fresh process)
def memory_mib() -> dict[str, float]:
    """VmRSS, RssAnon (private) and RssFile (file-backed) of this process, MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "RssAnon", "RssFile")}


def measure(index_file: Path, queries_file: Path, truth_file: Path, params_json: str, mode: str) -> dict:
    """Load ``index_file`` (``mode``: ``ram`` read into memory; ``mmap`` memory-mapped as the service does; ``cold``
    memory-mapped with the file first dropped from the page cache and only the base index warmed up, so the refine
    store of a refined index is read from disk during the timed searches), apply its search params, time batch 512
    and batch 1, measure recall; the memory the index added (``mib``) and, for ``cold``, after the warm-up."""
    import faiss

    from retrieval_server.index.dense import read_index
    from retrieval_server.index.kinds import apply_search_params
    from retrieval_server.index.tuning import recall_at

    queries, truth = np.load(queries_file), np.load(truth_file)  # [q, dim], [q, 10]
    if mode == "cold":  # drop the file's clean pages (no process maps it now); root is not needed
        os.sync()
        with open(index_file, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    before = memory_mib()
    index = faiss.read_index(str(index_file)) if mode == "ram" else read_index(index_file)
    apply_search_params(index, json.loads(params_json))
    warm = faiss.downcast_index(index.base_index) if mode == "cold" and hasattr(index, "base_index") else index
    warm.search(queries[:BATCH], 10)  # warm-up: first touches, thread pool (cold: the base index only)
    warmed = memory_mib()
    n512 = min(2 * BATCH, len(queries))  # (before 2026-11-25 q/s counted 1024 for the 1000 searched: 2.4% high)
    start = time.perf_counter()
    found = np.concatenate([index.search(queries[s:min(s + BATCH, n512)], 3)[1] for s in range(0, n512, BATCH)])
    qps512 = n512 / (time.perf_counter() - start)  # found: [n512, 3]
    ones = queries[-N_BATCH1:]  # batch 1: the last queries (cold mode: after the batches, whose reads are cached)
    start = time.perf_counter()
    for q in ones:
        index.search(q[None], 3)  # top-3: the service's default
    qps1 = len(ones) / (time.perf_counter() - start)
    after = memory_mib()
    found10 = np.concatenate([index.search(queries[s:min(s + BATCH, n512)], 10)[1] for s in range(0, n512, BATCH)])
    return {"mib": {k: after[k] - before[k] for k in after}, "mib_warm": {k: warmed[k] - before[k] for k in after},
            "qps_1": qps1, "qps_512": qps512, "recall_3": recall_at(found, truth[:n512, :3]),
            "recall_10": recall_at(found10, truth[:n512])}


# ---------------------------------------------------------------- parts
def part_kinds(args: argparse.Namespace, vectors: np.ndarray, tune_q: np.ndarray, eval_q: np.ndarray,
               out: Path) -> list[dict]:
    import faiss

    from retrieval_server.index.dense import build_dense_index
    from retrieval_server.index.kinds import search_params
    from retrieval_server.index.tuning import TuningError, tune_search_params

    tune_truth = exact_topk(vectors, tune_q, 10, out / "truth_tune.npy")
    eval_truth = exact_topk(vectors, eval_q, 10, out / "truth_eval.npy")
    stride = len(vectors) // args.real
    if stride > 1:  # where the true neighbours are: a faithful sample puts many of them among the sampled rows
        print(f"real rows among the exact top-3 / top-10 of the measuring queries: "
              f"{(eval_truth[:, :3] % stride == 0).mean():.3f} / {(eval_truth % stride == 0).mean():.3f} "
              f"(they are {1 / stride:.3f} of the rows)", flush=True)
    np.save(out / "queries_eval.npy", eval_q)
    n, dim = vectors.shape
    rows = []
    for spec in args.kinds.split(","):
        kind, hnsw_m, refine = parse_spec(spec)
        index_file, built_file = out / f"{spec}.index", out / f"{spec}.built.json"
        reused = args.reuse and index_file.exists() and built_file.exists()
        if reused:
            print(f"reusing {index_file} (built by an earlier run: {built_file}); tuning it again", flush=True)
            built = json.loads(built_file.read_text())
            index = faiss.read_index(str(index_file))
            params = built.get("build_params", built["params"])
        else:
            start = time.perf_counter()
            print(f"building {spec} over {n} vectors", flush=True)
            index, params = build_dense_index(batches(vectors), kind, dim, n, refine, hnsw_m=hnsw_m)
            built = {"build_s": time.perf_counter() - start, "build_params": params}
        reached = True
        if kind != "flat":
            try:
                params = tune_search_params(index, kind, params, tune_q, tune_truth, args.target_recall, k=3)
            except TuningError as e:  # measured at the top of its ladder (or its only setting) instead
                print(f"  {e}", flush=True)
                reached = False
                params = {**params, **TOP_OF_LADDER.get(kind, {}), **({"k_factor": 64} if refine != "none" else {})}
        built.update(params=search_params(params), target_reached=reached)
        if not reused:
            faiss.write_index(index, str(index_file))
        built_file.write_text(json.dumps(built))
        del index
        figures = {}
        for mode in ("ram", "mmap", "cold") if refine != "none" else ("ram", "mmap"):
            cmd = [sys.executable, __file__, "--measure", str(index_file), str(out / "queries_eval.npy"),
                   str(out / "truth_eval.npy"), json.dumps(built["params"]), mode]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"measuring {spec} failed:\n{done.stderr[-3000:]}")
            figures[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        row = {"kind": spec, "bytes_per_vector": index_file.stat().st_size / n,
               **{k: v for k, v in built.items() if k != "build_params"}, **figures["ram"],
               "mmap": figures["mmap"], "cold": figures.get("cold")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "kinds.json").write_text(json.dumps(rows, indent=1))
    return rows


def parse_spec(spec: str) -> tuple[str, int | None, str]:
    """``KIND[:M<links>][+REFINE]`` (``hnswsq8:M8+fp32``) -> (kind, HNSW links per node or None, refine store)."""
    base, _, refine = spec.partition("+")
    kind, _, links = base.partition(":M")
    return kind, int(links) if links else None, refine or "none"


def print_kinds(rows: list[dict], n: int) -> None:
    flat = next((r for r in rows if r["kind"] == "flat"), None)
    print(f"\n{n} vectors x 384; recall against exact search on {N_EVAL} held-out queries")
    print("| kind | search params | bytes/vector | RSS MiB in RAM | mmapped: private / file MiB | build s | "
          "q/s batch 1 | q/s batch 512 | x flat @512 | RSS vs flat | recall@3 | recall@10 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['qps_512'] / flat['qps_512']:.1f}x" if flat else "-"
        mem = f"{r['mib']['VmRSS'] / flat['mib']['VmRSS']:.2f}" if flat else "-"
        target = "" if r["target_reached"] else " (target not reached)"
        print(f"| {r['kind']} | {json.dumps(r['params'])}{target} | {r['bytes_per_vector']:.0f} | "
              f"{r['mib']['VmRSS']:.0f} | {r['mmap']['mib']['RssAnon']:.0f} / {r['mmap']['mib']['RssFile']:.0f} | "
              f"{r['build_s']:.0f} | {r['qps_1']:.0f} | {r['qps_512']:.0f} | {ratio} | {mem} | "
              f"{r['recall_3']:.4f} | {r['recall_10']:.4f} |")
    cold = [r for r in rows if r.get("cold")]
    if cold and flat:
        print("\nrefined kinds, memory-mapped with the file dropped from the page cache and only the base index warmed "
              "(the refine store read from disk while timed); memory against flat's in-RAM RSS:")
        print("| kind | RSS MiB after warm-up | RSS MiB after the timed searches | RSS vs flat | q/s batch 512 | "
              "x flat @512 | q/s batch 1 | recall@3 |")
        print("|---|---|---|---|---|---|---|---|")
        for r in cold:
            c = r["cold"]
            print(f"| {r['kind']} | {c['mib_warm']['VmRSS']:.0f} | {c['mib']['VmRSS']:.0f} | "
                  f"{c['mib']['VmRSS'] / flat['mib']['VmRSS']:.2f} | {c['qps_512']:.0f} | "
                  f"{c['qps_512'] / flat['qps_512']:.1f}x | {c['qps_1']:.0f} | {c['recall_3']:.4f} |")


def scale_corpus(data: Path, n: int) -> Path:
    """A corpus of ``n`` lines for the sampled vectors (``{"id": "<row>", "contents": "passage <row>"}``): what a
    shard server needs to turn rows into passages (the texts do not match the vectors; the import check is
    skipped)."""
    path = data / f"scale_{n}" / "corpus.jsonl"
    if not path.exists() or path.stat().st_size == 0:
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            for row in range(n):
                f.write(json.dumps({"id": str(row), "contents": f"passage {row}"}) + "\n")
        tmp.replace(path)
    return path


def part_shards(args: argparse.Namespace, data: Path, real_corpus: Path, out: Path) -> list[dict]:
    """Flat shards of the ``--vectors`` set, each served by its own process, queried through the client."""
    from retrieval_server.index.import_faiss import import_index
    from retrieval_server.launcher import ServerProcess
    from search_r1.search.client import RetrievalClient

    flat = out / "flat.index"
    if not flat.exists():
        raise SystemExit(f"{flat} missing: run --parts kinds with flat first")
    corpus = scale_corpus(data, args.vectors)
    questions = make_queries(real_corpus, N_TUNE + N_EVAL, seed=7)[N_TUNE:N_TUNE + 2 * BATCH]  # the eval queries
    rows, answers = [], {}
    for n_shards in [int(x) for x in args.shards.split(",")]:
        index_dir = out / f"shards{n_shards}"
        if n_shards == 1:
            import_index(flat, corpus, index_dir, sample=0, progress=False)
            dirs = [index_dir]
        else:
            import_index(flat, corpus, index_dir, sample=0, progress=False, shards=n_shards)
            dirs = [index_dir / f"shard-{i}" for i in range(n_shards)]
        threads = max(1, (os.cpu_count() or 1) // n_shards)
        servers = [ServerProcess(d, corpus, ["--threads", str(threads), "--max-queries", str(BATCH)]) for d in dirs]
        try:
            for server in servers:
                server.wait_ready(timeout=600)
            with RetrievalClient(",".join(s.url for s in servers), topk=3, timeout=600) as client:
                client.check_health()
                client.search(questions[:64])  # warm-up
                start = time.perf_counter()
                found = [client.search(questions[i:i + BATCH]) for i in range(0, len(questions), BATCH)]
                seconds = time.perf_counter() - start
        finally:
            for server in servers:
                server.stop()
        answers[n_shards] = [[doc["id"] for doc in docs] for batch in found for docs in batch]
        same = answers[n_shards] == answers[min(answers)]
        rows.append({"shards": n_shards, "threads_per_server": threads, "qps_512": len(questions) / seconds,
                     "same_top3_as_1": same})
        print(json.dumps(rows[-1]), flush=True)
    (out / "shards.json").write_text(json.dumps(rows, indent=1))
    return rows


def part_projection(rows: list[dict], n: int, dim: int) -> None:
    """21M x 768 on 1 and 4 nodes, from the measured rows (assumptions printed with the table)."""
    from retrieval_server.index.kinds import bytes_per_vector

    scale = (TARGET_N / n) * (TARGET_DIM / dim)  # work per query grows with rows x dimension
    print(f"\nprojection to {TARGET_N / 1e6:.0f}M passages x {TARGET_DIM} (e5-base): memory = rows x bytes per "
          f"vector at d={TARGET_DIM} (kinds.bytes_per_vector); q/s = measured q/s at batch {BATCH} / {scale:.1f} "
          f"(rows x dimension: every kind here scans a share of the rows that stays about constant at the same "
          f"recall, so its work grows with N x d), per node with this machine's 2 cores; 4 nodes hold 1/4 of the rows "
          "each (shards) and answer in parallel: 4x the q/s of one node, less the client's merge")
    print("| kind | GB, 1 node | GB per node, 4 nodes | q/s batch 512, 1 node (2 cores) | 4 nodes |")
    print("|---|---|---|---|---|")
    for r in rows:
        kind, hnsw_m, refine = parse_spec(r["kind"])
        gb = bytes_per_vector(kind, TARGET_DIM, refine, hnsw_m) * TARGET_N / 1e9
        qps = r["qps_512"] / scale
        print(f"| {r['kind']} | {gb:.1f} | {gb / 4:.1f} | {qps:.1f} | {4 * qps:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vectors", type=int, default=2_000_000)
    p.add_argument("--real", type=int, default=100_000)
    p.add_argument("--model", choices=("local", "mixture"), default="local",
                   help="how the vectors beyond the real ones are made (synthetic_vectors.py)")
    p.add_argument("--kinds", default="flat,sq8,fp16,ivf,ivfsq8,ivfpq+sq8,ivfpq+fp16,opq+fp16")
    p.add_argument("--target-recall", type=float, default=0.99)
    p.add_argument("--shards", default="1,2,3")
    p.add_argument("--parts", default="kinds,shards,projection")
    p.add_argument("--data", type=Path, default=ROOT / "data" / "bench")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_index_scale")
    p.add_argument("--threads", type=int, default=0, help="FAISS threads (0: all cores)")
    p.add_argument("--reuse", action="store_true",
                   help="kinds: tune and measure an index an earlier run built in --out again instead of rebuilding")
    p.add_argument("--measure", nargs=5, help=argparse.SUPPRESS)  # internal: one index in a fresh process
    args = p.parse_args()
    if args.threads:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    if args.measure:
        print(json.dumps(measure(Path(args.measure[0]), Path(args.measure[1]), Path(args.measure[2]),
                                 args.measure[3], args.measure[4])))
        return
    unknown = set()
    for spec in args.kinds.split(","):
        try:
            kind, hnsw_m, refine = parse_spec(spec)
        except ValueError:  # M not a number
            kind, hnsw_m, refine = "", None, ""
        if kind not in KINDS or refine not in ("none", "fp32", "fp16", "sq8") or (
                hnsw_m is not None and (not kind.startswith("hnsw") or hnsw_m < 2)):
            unknown.add(spec)
    if unknown:
        raise SystemExit(f"unknown --kinds {sorted(unknown)}; choose from {', '.join(KINDS)}, an HNSW kind "
                         "optionally with :M<links per node, >= 2> (hnswsq8:M8), each optionally +fp32, +fp16 or "
                         "+sq8 (a refine store)")
    if args.vectors < args.real:
        raise SystemExit(f"--vectors {args.vectors} < --real {args.real}: the real encodings are part of the set")
    args.out.mkdir(parents=True, exist_ok=True)
    real, corpus = real_vectors(args.data, args.real)
    queries = encode_queries(args.data, corpus, N_TUNE + N_EVAL)
    tune_q, eval_q = queries[:N_TUNE], queries[N_TUNE:]
    vectors = scale_vectors(args.data, args.vectors, real, args.model)
    if args.vectors >= 2 * len(real):  # a sample as large as the real set, to compare their neighbourhoods
        head = np.ones(2 * len(real), bool)  # the first rows, less the real ones spread among them
        head[np.arange(0, 2 * len(real), args.vectors // len(real))] = False
        sampled = np.ascontiguousarray(vectors[:2 * len(real)][head][:len(real)])
        print(f"fit check, best scores of {N_EVAL} queries: real {neighbour_profile(eval_q, real)}; "
              f"as many sampled {neighbour_profile(eval_q, sampled)}", flush=True)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    parts = args.parts.split(",")
    if "kinds" in parts:
        print_kinds(part_kinds(args, vectors, tune_q, eval_q, args.out), args.vectors)
    if "projection" in parts:
        part_projection(json.loads((args.out / "kinds.json").read_text()), args.vectors, vectors.shape[1])
    if "shards" in parts:
        shard_rows = part_shards(args, args.data, corpus, args.out)
        print(f"\nflat index of {args.vectors} vectors in row-range shards, one server each (FAISS threads = cores / "
              f"shards), {2 * BATCH} queries at batch {BATCH} through the client, encoder included")
        print("| shards | q/s at batch 512 | top-3 equal to 1 shard |")
        print("|---|---|---|")
        for r in shard_rows:
            print(f"| {r['shards']} | {r['qps_512']:.0f} | {r['same_top3_as_1']} |")


if __name__ == "__main__":
    main()
