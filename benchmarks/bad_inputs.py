"""Bad inputs, given as a user would, to the newer surfaces; every outcome classified and counted.

    python -m benchmarks.bad_inputs [--jobs 2] [--only SURFACE ...] [--keep DIR]

Surfaces: several endpoints in ``retriever.url`` (shard sets, mixed kinds, foreign endpoints, separators), a dead
``RAY_ADDRESS`` for every command that joins a cluster, ``build_index`` (``--index auto``, ``--shards``) and
``import_index`` over a good index, numeric trainer keys (learning rates, temperatures, clip ratios, coefficients,
NaN/Inf), reward-term shapes, ``search_r1.infer`` questions, ``/retrieve`` options and the API docs pages.

Everything is real and on loopback: a tiny policy, 8-row parquet files, a 20-passage corpus, its flat, BM25 and
sharded indexes (two builds, and a second corpus), six retrieval servers and one foreign HTTP server. Each command
runs as a subprocess with a timeout (its own session, killed whole at the deadline); an HTTP case is one request.

Outcome classes: ``error`` (exit 2 or a 4xx, no traceback), ``accepted`` (exit 0 or 200), ``traceback``, ``hang``
(killed at the timeout), ``data loss`` (the good index given as ``--out`` changed, checked by the sha256 of every
file), ``other`` (any other exit). A case states the class it must end in; the exit status is 1 if any does not.
Prints one line per case and the counts per class and surface.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVER_ARGS = ["--threads", "1", "--topk", "3", "--max-topk", "10"]
PASSAGES = [(f"p{i}", f"Guild {i} of Vuzaholm", f"The guild number {i} of Vuzaholm was founded by name {i}.")
            for i in range(20)]
OTHER = [(f"q{i}", f"Harbour {i}", f"Harbour {i} of Estmark has {i} piers and a lighthouse.") for i in range(20)]


@dataclass
class Case:
    surface: str
    name: str
    expect: str  # "error" | "accepted"
    argv: list[str] = field(default_factory=list)  # python -m ...
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 240.0
    guard: Path | None = None  # a good index that must come out byte for byte
    http: tuple[str, str, str | None] | None = None  # (method, url, raw body)


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def write_corpus(path: Path, passages: list[tuple[str, str, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n" for i, t, x in passages))
    return path


class Workspace:
    """Model, data, corpora, indexes and servers in ``root``; ``close`` stops the servers."""

    def __init__(self, root: Path):
        from data_prep.qa_search import make_row, rows_to_parquet
        from data_prep.tiny_model import save_tiny_model
        from retrieval_server.index.build import build_index
        from retrieval_server.launcher import ServerProcess, free_port
        from search_r1.prompts import make_prompt

        self.root = root
        questions = [f"Who founded the guild number {i} of Vuzaholm" for i in range(8)]
        texts = [make_prompt(q) for q in questions]
        texts += ["the answer is <answer> here </answer> <search> q </search>"] * 10
        save_tiny_model(root / "model", texts, vocab_size=600)
        rows = [make_row("toy", q, [f"name {i}"], "train", i) for i, q in enumerate(questions)]
        rows_to_parquet(rows, root / "train.parquet")
        rows_to_parquet(rows[:4], root / "test.parquet")
        self.corpus = write_corpus(root / "corpus.jsonl", PASSAGES)
        self.other_corpus = write_corpus(root / "other.jsonl", OTHER)
        ix = root / "indexes"
        build_index(self.corpus, ix / "flat", progress=False)
        build_index(self.corpus, ix / "bm25", retriever="bm25", progress=False)
        build_index(self.corpus, ix / "a", shards=2, progress=False)
        build_index(self.corpus, ix / "b", shards=2, progress=False)  # another build: another shard-set id
        build_index(self.other_corpus, ix / "c", shards=2, progress=False)
        self.flat_index = ix / "flat"
        self._stack = ExitStack()
        servers = {"flat": (ix / "flat", self.corpus, []), "bm25": (ix / "bm25", self.corpus, []),
                   "a0": (ix / "a/shard-0", self.corpus, []), "a1": (ix / "a/shard-1", self.corpus, []),
                   "b1": (ix / "b/shard-1", self.corpus, []), "c1": (ix / "c/shard-1", self.other_corpus, []),
                   "docs": (ix / "bm25", self.corpus, ["--docs"])}
        started = {name: self._stack.enter_context(ServerProcess(index, corpus, SERVER_ARGS + extra))
                   for name, (index, corpus, extra) in servers.items()}
        for server in started.values():
            server.wait_ready(timeout=300)
        self.url = {name: server.url for name, server in started.items()}
        (root / "foreign").mkdir()
        (root / "foreign" / "health").write_text("<html>not a retrieval service</html>\n")
        port = free_port()
        foreign = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                   cwd=root / "foreign", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._stack.callback(foreign.kill)
        self.url["foreign"] = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(self.url["foreign"] + "/health")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        self.dead_ray = f"127.0.0.1:{free_port()}"  # nothing listens there

    def good_copy(self, name: str) -> Path:
        """A fresh copy of the flat index: the user's good index a failing command is pointed at."""
        out = self.root / "good" / name
        shutil.copytree(self.flat_index, out)
        return out

    def train(self, *extra: str, out: str | None = None) -> list[str]:
        """``main_ppo`` for 1 step of the tiny policy (no search unless ``extra`` turns it on), in its own run
        directory."""
        ws, out = self.root, out or hashlib.sha256(" ".join(extra).encode()).hexdigest()[:12]
        return ["verl.trainer.main_ppo", "--config", str(ROOT / "configs/demo.yaml"),
                f"data.train_files={ws / 'train.parquet'}", f"data.val_files={ws / 'test.parquet'}",
                f"actor_rollout_ref.model.path={ws / 'model'}", "actor_rollout_ref.rollout.name=hf",
                "data.train_batch_size=4", "data.max_response_length=16", "data.max_obs_length=16",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_mini_batch_size=4",
                "critic.ppo_micro_batch_size_per_gpu=2", "do_search=false", "trainer.total_training_steps=1",
                "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[jsonl]",
                f"trainer.default_local_dir={ws / 'runs' / out}", *extra]

    def close(self) -> None:
        self._stack.close()


def cases(ws: Workspace) -> list[Case]:
    u, out = ws.url, []

    def add(surface: str, name: str, expect: str, argv: list[str] | None = None, **kw) -> None:
        out.append(Case(surface, name, expect, argv or [], **kw))

    # -- several endpoints in retriever.url, through the trainer and evaluate
    sets = {"a shard alone": u["a0"], "a missing shard": f"{u['a0']},{u['a0']}",
            "shards of two builds": f"{u['a0']},{u['b1']}", "shards of two corpora": f"{u['a0']},{u['c1']}",
            "a whole index and a shard": f"{u['flat']},{u['a1']}", "BM25 and dense": f"{u['bm25']},{u['flat']}",
            "a foreign endpoint beside ours": f"{u['flat']},{u['foreign']}", "a foreign endpoint alone": u["foreign"],
            "two foreign endpoints": f"{u['foreign']},{u['foreign']}/",
            "joined with ';'": f"{u['a0']};{u['a1']}", "joined with a space": f"{u['a0']} {u['a1']}",
            "an empty entry": f"{u['a0']},,{u['a1']}", "a port out of range": "http://127.0.0.1:99999",
            "ftp scheme": "ftp://127.0.0.1:21", "a query string": f"{u['flat']}?x=1", "no host": "http://:8000",
            "ray:// without a name": "ray://", "ray:// with a path": "ray://a/b"}
    for name, url in sets.items():
        add("retriever.url", f"main_ppo: {name}", "error", ws.train("do_search=true", f"retriever.url={url}"))
    for name in ("a shard alone", "shards of two builds", "BM25 and dense", "a foreign endpoint alone",
                 "joined with ';'"):
        add("retriever.url", f"evaluate: {name}", "error",
            ["search_r1.evaluate", "--model", str(ws.root / "model"), "--data", str(ws.root / "test.parquet"),
             "--out", str(ws.root / "eval" / name.replace(" ", "_")), "--retriever-url", sets[name]])
    add("retriever.url", "main_ppo: shards each ending in /retrieve", "accepted",
        ws.train("do_search=true", f"retriever.url={u['a0']}/retrieve,{u['a1']}/retrieve", out="retrieve_suffix"),
        timeout=600)

    # -- a Ray address where no cluster answers
    dead = {"RAY_ADDRESS": ws.dead_ray}
    add("ray", "main_ppo trainer.backend=ray", "error", ws.train("trainer.backend=ray", "trainer.ray_timeout_s=5"),
        env=dead, timeout=120)
    add("ray", "main_ppo retriever.url=ray://wiki", "error",
        ws.train("do_search=true", "retriever.url=ray://wiki", "trainer.ray_timeout_s=5"), env=dead, timeout=120)
    add("ray", "evaluate --retriever-url ray://wiki", "error",
        ["search_r1.evaluate", "--model", str(ws.root / "model"), "--data", str(ws.root / "test.parquet"), "--out",
         str(ws.root / "eval" / "ray"), "--retriever-url", "ray://wiki", "--ray-timeout", "5"], env=dead, timeout=120)
    add("ray", "infer --retriever-url ray://wiki", "error",
        ["search_r1.infer", "--model", str(ws.root / "model"), "--question", "who founded guild 3",
         "--retriever-url", "ray://wiki", "--ray-timeout", "5"], env=dead, timeout=120)
    for command in (["status", "--name", "wiki"], ["down", "--name", "wiki"],
                    ["up", "--name", "wiki", "--index", str(ws.flat_index), "--corpus", str(ws.corpus)]):
        add("ray", f"ray_service {command[0]}", "error",
            ["retrieval_server.ray_service", *command, "--ray-timeout", "5"], env=dead, timeout=120)
    add("ray", "ray_service status (default --ray-timeout)", "error",
        ["retrieval_server.ray_service", "status", "--name", "wiki"], env=dead, timeout=120)
    add("ray", "ray_service --ray-timeout nan", "error",
        ["retrieval_server.ray_service", "--ray-timeout", "nan", "status", "--name", "wiki"], env=dead)
    add("ray", "main_ppo trainer.ray_timeout_s=inf", "error", ws.train("trainer.ray_timeout_s=inf"))

    # -- index builds and imports pointed at a good index
    corrupt = ws.root / "corrupt.index"
    corrupt.write_bytes((ws.flat_index / "faiss.index").read_bytes()[:1000])
    short = ws.root / "short.jsonl"
    write_corpus(short, PASSAGES[:-1])
    broken_encoder = ws.root / "broken_encoder"
    broken_encoder.mkdir()
    (broken_encoder / "config.json").write_text('{"model_type": "bert", "hidden_')
    build = ["retrieval_server.build_index", "--corpus", str(ws.corpus)]
    builds = {
        "build --index auto, budget holds no candidate": build + ["--index", "auto", "--from-flat", str(ws.flat_index),
                                                                  "--target-recall", "0.9", "--memory-budget", "1e-9"],
        "build --index auto, target recall out of reach": build + ["--index", "auto", "--from-flat",
                                                                   str(ws.flat_index), "--target-recall", "1.0",
                                                                   "--memory-budget", "1e-6"],
        "build --shards with an encoder that does not load": build + ["--shards", "2", "--model", str(broken_encoder)],
        "build --shards 0": build + ["--shards", "0"],
        "build --shards 1000 (more than passages)": build + ["--shards", "1000"],
        "build --shards 2 --retriever bm25": build + ["--shards", "2", "--retriever", "bm25"],
        "build --memory-budget nan": build + ["--index", "auto", "--from-flat", str(ws.flat_index),
                                              "--target-recall", "0.9", "--memory-budget", "nan"],
        "build --target-recall nan": build + ["--index", "hnsw", "--target-recall", "nan"],
        "build --from-flat a BM25 index": build + ["--index", "sq8", "--from-flat", str(ws.root / "indexes/bm25")],
        "build --from-flat of another corpus": ["retrieval_server.build_index", "--corpus", str(ws.other_corpus),
                                                "--index", "sq8", "--from-flat", str(ws.flat_index)],
        "build from a missing corpus": ["retrieval_server.build_index", "--corpus", str(ws.root / "nope.jsonl")],
        "import a corrupt FAISS file": ["retrieval_server.import_index", "--faiss", str(corrupt), "--corpus",
                                        str(ws.corpus)],
        "import a corrupt FAISS file --shards 2": ["retrieval_server.import_index", "--faiss", str(corrupt),
                                                   "--corpus", str(ws.corpus), "--shards", "2"],
        "import with a corpus one passage short": ["retrieval_server.import_index", "--faiss",
                                                   str(ws.flat_index / "faiss.index"), "--corpus", str(short)],
        "import --shards 0": ["retrieval_server.import_index", "--faiss", str(ws.flat_index / "faiss.index"),
                              "--corpus", str(ws.corpus), "--shards", "0"],
        "import a missing file": ["retrieval_server.import_index", "--faiss", str(ws.root / "nope.index"),
                                  "--corpus", str(ws.corpus)],
    }
    for i, (name, argv) in enumerate(builds.items()):
        good = ws.good_copy(f"g{i}")
        add("index build/import", name, "error", argv + ["--out", str(good)], guard=good)

    # -- numeric trainer settings and reward-term shapes (refused before any model loads)
    numbers = ["actor_rollout_ref.actor.optim.lr=inf", "actor_rollout_ref.actor.optim.lr=nan",
               "actor_rollout_ref.actor.optim.lr=-inf", "actor_rollout_ref.actor.optim.lr=5", "critic.optim.lr=inf",
               "actor_rollout_ref.rollout.temperature=inf", "actor_rollout_ref.rollout.temperature=1e6",
               "actor_rollout_ref.rollout.val_kwargs.temperature=nan", "actor_rollout_ref.actor.clip_ratio=inf",
               "actor_rollout_ref.actor.clip_ratio=1.5", "actor_rollout_ref.actor.clip_ratio_high=nan",
               "actor_rollout_ref.actor.clip_ratio_c=inf", "actor_rollout_ref.actor.entropy_coeff=inf",
               "actor_rollout_ref.actor.kl_loss_coef=nan", "algorithm.kl_ctrl.kl_coef=inf",
               "critic.value_loss_coef=nan",
               "algorithm.gamma=nan", "algorithm.turn_reward_coef=inf", "actor_rollout_ref.actor.grad_clip=inf",
               "actor_rollout_ref.actor.grad_clip=0", "critic.cliprange_value=inf",
               "actor_rollout_ref.actor.optim.weight_decay=inf", "actor_rollout_ref.rollout.top_p=nan",
               "retriever.timeout=inf", "retriever.coalesce_ms=nan", "reward.format_score=nan",
               "actor_rollout_ref.actor.tis_cap=inf", "algorithm.overlong.penalty_factor=inf",
               "reward.terms=[em,f1]", "reward.terms={em:inf}", "reward.terms={bogus:1.0}", "reward.terms=em",
               "reward.terms={em:-1}", "trainer.logger=console"]
    for override in numbers:
        add("trainer settings", override, "error", ws.train(override))
    add("trainer settings", "reward.terms={em:1.0,f1:0.5} (Hydra style)", "accepted",
        ws.train("reward.terms={em:1.0,f1:0.5}", out="hydra_terms"), timeout=600)

    # -- search_r1.infer
    infer = ["search_r1.infer", "--model", str(ws.root / "model"), "--retriever-url", u["flat"]]
    for name, question in (("empty", ""), ("blank", "   "), ("newlines", "\n\n"), ("100 kB", "why " * 25_000)):
        add("infer", f"--question {name}", "error", infer + ["--question", question])
    for name, flags in (("--temperature inf", ["--temperature", "inf"]),
                        ("--temperature nan", ["--temperature", "nan"]), ("--topk 0", ["--topk", "0"]),
                        ("--max-turns -1", ["--max-turns", "-1"]),
                        ("--ray-timeout 0", ["--ray-timeout", "0"])):
        add("infer", name, "error", infer + ["--question", "who founded guild 3", *flags])
    add("infer", "a shard alone as --retriever-url", "error",
        ["search_r1.infer", "--model", str(ws.root / "model"), "--retriever-url", u["a0"], "--question", "who?"])

    # -- /retrieve options and the docs pages
    retrieve = u["flat"] + "/retrieve"
    topk = {"1e9": "1000000000", "-1": "-1", "NaN": "NaN", "Infinity": "Infinity", "2.5": "2.5", "'3'": '"3"',
            "true": "true", "1e400": "1e400"}
    bodies = {f"topk {name}": f'{{"queries": ["guild"], "topk": {value}}}' for name, value in topk.items()}
    bodies |= {"return_scores 'yes'": '{"queries": ["guild"], "return_scores": "yes"}',
               "return_rows 1": '{"queries": ["guild"], "return_rows": 1}', "queries a string": '{"queries": "guild"}',
               "queries [1]": '{"queries": [1]}', "queries null": '{"queries": null}', "a list body": '["guild"]',
               "queries ['']": '{"queries": [""]}'}
    for name, body in bodies.items():
        add("/retrieve", name, "error", http=("POST", retrieve, body))
    add("/retrieve", "topk null, extra field", "accepted",
        http=("POST", retrieve, '{"queries": ["guild"], "topk": null, "x": 1}'))
    for page in ("/docs", "/redoc", "/openapi.json"):
        add("/retrieve", f"GET {page} without --docs", "error", http=("GET", u["flat"] + page, None))
    add("/retrieve", "GET /docs with --docs", "accepted", http=("GET", u["docs"] + "/docs", None))
    return out


def run_case(case: Case) -> tuple[str, float, str]:
    """(outcome class, seconds, last line of output)."""
    start = time.monotonic()
    before = digest(case.guard) if case.guard else None
    if case.http:
        method, url, body = case.http
        response = httpx.request(method, url, content=body, headers={"content-type": "application/json"},
                                 timeout=case.timeout)
        status = response.status_code
        outcome = "accepted" if status == 200 else "error" if 400 <= status < 500 else "other"
        return outcome, time.monotonic() - start, f"HTTP {status} {response.text[:150]}"
    proc = subprocess.Popen([sys.executable, "-m", *case.argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **case.env})
    try:
        output, _ = proc.communicate(timeout=case.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return "hang", time.monotonic() - start, (output or "").strip()[-150:]
    lines = [line for line in output.strip().splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
    if before is not None and digest(case.guard) != before:
        outcome = "data loss"
    elif "Traceback (most recent call last)" in output:
        outcome = "traceback"
    else:
        outcome = {0: "accepted", 2: "error"}.get(proc.returncode, "other")
    return outcome, time.monotonic() - start, f"exit {proc.returncode}: {last[:200]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2, help="cases run at the same time")
    p.add_argument("--only", nargs="*", default=None, help="surfaces to run (default: all)")
    p.add_argument("--keep", type=Path, default=None, help="build the workspace here and keep it")
    args = p.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bad_inputs_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"workspace {root}", flush=True)
    ws = Workspace(root)
    try:
        todo = [c for c in cases(ws) if args.only is None or c.surface in args.only]
        print(f"{len(todo)} cases, {args.jobs} at a time", flush=True)
        results = []
        with ThreadPoolExecutor(args.jobs) as pool:
            for case, (outcome, seconds, detail) in zip(todo, pool.map(run_case, todo), strict=True):
                ok = "ok " if outcome == case.expect else "BAD"
                print(f"{ok} {outcome:9s} {seconds:6.1f}s  [{case.surface}] {case.name}: {detail}", flush=True)
                results.append((case, outcome))
    finally:
        ws.close()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print("\noutcomes by surface:")
    for surface in dict.fromkeys(c.surface for c, _ in results):
        counts = Counter(outcome for c, outcome in results if c.surface == surface)
        print(f"  {surface:20s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    totals = Counter(outcome for _, outcome in results)
    print(f"total {len(results)}: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    unexpected = [(c, o) for c, o in results if o != c.expect]
    print(f"outside the expected class: {len(unexpected)}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
