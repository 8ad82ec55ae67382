"""Asynchronous rollout vs lockstep turns: trajectories/s, step time, engine idle share and staleness (figures).

Trains the demo policy with GRPO (n=5, 16 prompts = 80 trajectories per step, ``--steps`` steps, Ray world 2 on
CPU) against the real BM25 retrieval service over the demo knowledge base, whose answers are delayed by
``--delay-ms`` (the service's benchmark-only option: a dense search over 21M passages or a web search API costs
0.1-3 s). One fresh trainer process per (delay, variant, run); the variants:

    sync       rollout.mode=sync: lockstep turns (one engine call per turn for all active rows, one retrieval
               per turn), each batch generated after the previous update
    async      rollout.mode=async, trainer.max_staleness=0: no turn barrier, still on-policy
    async-k1   async, max_staleness=1, engines on the training ranks (colocated): batch s+1 is generated while
               step s trains
    async-k1-disagg  async, max_staleness=1, trainer.rollout_ranks=1: one rank generates, one trains

Per variant and delay, over the runs (each run's steps after the first, which warms up): trajectories/s
(trajectories / seconds of those steps), mean step seconds, ``perf/rollout_idle_frac`` (engine time with nothing
to generate, during generation), ``rollout/staleness_mean``, the retrieval wait per trajectory, and the speed-up
over ``sync`` at the same delay (ratio of the runs' mean trajectories/s, with the range over runs). Variants run
interleaved (run 1 of every variant, then run 2, ...), so a machine that slows down mid-benchmark affects all.

``--parity`` instead compares the two schedules on the 200 demo test questions with greedy decoding through
``search_r1.evaluate`` (HF and vLLM engines): its wall time per mode and the rows whose trajectory differs.

    python benchmarks/bench_async.py [--delays 0,300,1000] [--runs 3] [--steps 10] [--variants sync,async,...]
                                     [--resume]
    python benchmarks/bench_async.py --parity [--engines hf,vllm]

Needs the demo data and warm-started policy (``make demo`` once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from retrieval_server.launcher import ServerProcess, free_port  # noqa: E402
from verl.utils.tracking import read_metrics  # noqa: E402

DEMO = ROOT / "data/demo"
VARIANTS = {
    "sync": ["actor_rollout_ref.rollout.mode=sync"],
    "async": ["actor_rollout_ref.rollout.mode=async"],
    "async-k1": ["actor_rollout_ref.rollout.mode=async", "trainer.max_staleness=1",
                 "actor_rollout_ref.actor.tis_cap=2"],
    "async-k1-disagg": ["actor_rollout_ref.rollout.mode=async", "trainer.max_staleness=1",
                        "actor_rollout_ref.actor.tis_cap=2", "trainer.rollout_ranks=1"],
}


def start_service(delay_ms: float) -> ServerProcess:
    server = ServerProcess(DEMO / "index_bm25", DEMO / "corpus.jsonl", ["--threads", "1", "--delay-ms", str(delay_ms)],
                           port=free_port())
    server.wait_ready()
    return server


def train(url: str, variant: str, steps: int, out: Path, extra: list[str]) -> list[dict]:
    """One training run -> its metrics records (SystemExit naming the log if it fails)."""
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "--config", "configs/demo.yaml", "--config",
           "configs/grpo.yaml", f"retriever.url={url}", f"trainer.total_training_steps={steps}",
           "data.train_batch_size=16", "actor_rollout_ref.rollout.n=5",
           "actor_rollout_ref.actor.ppo_mini_batch_size=80",
           "trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.val_before_train=false",
           "trainer.test_freq=0", "trainer.save_freq=0", "trainer.logger=[jsonl]", "trainer.resume_mode=disable",
           f"trainer.default_local_dir={out}", *VARIANTS[variant], *extra]
    log = out.with_suffix(".log")
    shutil.rmtree(out, ignore_errors=True)  # metrics.jsonl appends: an interrupted run's records must not mix in
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        status = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise SystemExit(f"{variant} failed (exit {status}); see {log}")
    return read_metrics(out / "metrics.jsonl")


def finished(out: Path, steps: int) -> list[dict] | None:
    """--resume: the metrics of a run that already completed its ``steps`` steps, else None (rerun it)."""
    path = out / "metrics.jsonl"
    records = read_metrics(path) if path.exists() else []
    return records if sum(1 for r in records if "timing/step" in r) >= steps else None


def summarise(records: list[dict]) -> dict[str, float]:
    """One run's figures over its steps after the first."""
    steps = [r for r in records if r["step"] > 1]
    seconds = sum(r["timing/step"] for r in steps)
    trajectories = 80 * len(steps)
    mean = lambda key: float(np.mean([r.get(key, 0.0) for r in steps]))  # noqa: E731
    return {"traj_per_s": trajectories / seconds, "step_s": seconds / len(steps),
            "idle": mean("perf/rollout_idle_frac"), "staleness": mean("rollout/staleness_mean"),
            "retrieval_wait_s": mean("agent/retrieval_wait_s"), "overlap_s": mean("perf/overlap_s")}


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(np.mean(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def bench(args: argparse.Namespace) -> None:
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; valid: {', '.join(VARIANTS)}")
    results: dict[tuple[float, str], list[dict]] = {}
    for delay in [float(d) for d in args.delays.split(",")]:
        with start_service(delay) as server:
            for run in range(args.runs):
                for variant in variants:
                    out = Path(args.out) / f"delay{delay:g}" / f"{variant}-run{run}"
                    start = time.perf_counter()
                    done = finished(out, args.steps) if args.resume else None
                    figures = summarise(done or train(server.url, variant, args.steps, out, args.overrides))
                    results.setdefault((delay, variant), []).append(figures)
                    print(f"delay {delay:g} ms  {variant:16s} run {run}: {figures['traj_per_s']:.2f} traj/s, "
                          f"{figures['step_s']:.2f} s/step, idle {figures['idle']:.2f}, staleness "
                          f"{figures['staleness']:.2f} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"\n{args.runs} runs x {args.steps} steps (figures over steps 2..{args.steps}); mean [min-max] over runs")
    print("| delay ms | variant | traj/s | x sync | s/step | engine idle | staleness | retrieval wait s/traj |")
    print("|---|---|---|---|---|---|---|---|")
    for (delay, variant), runs in results.items():
        base = [r["traj_per_s"] for r in results.get((delay, "sync"), [])]
        ratio = [r["traj_per_s"] / np.mean(base) for r in runs] if base else []
        print(f"| {delay:g} | {variant} | {spread([r['traj_per_s'] for r in runs])} | "
              f"{spread(ratio) if ratio else '-'} | {spread([r['step_s'] for r in runs])} | "
              f"{spread([r['idle'] for r in runs])} | {spread([r['staleness'] for r in runs])} | "
              f"{spread([r['retrieval_wait_s'] for r in runs], '{:.3f}')} |")


def evaluate(url: str, engine: str, mode: str, out: Path) -> float:
    """search_r1.evaluate on the demo test set with greedy decoding -> wall seconds."""
    cmd = [sys.executable, "-m", "search_r1.evaluate", "--model", str(DEMO / "tiny_policy"), "--data",
           str(DEMO / "test.parquet"), "--retriever-url", url, "--out", str(out), "--engine", engine,
           "--config", "configs/demo.yaml", f"actor_rollout_ref.rollout.mode={mode}"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"evaluate {engine} {mode} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def trajectories(out: Path) -> dict[tuple[int, int], dict]:
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    return {(r["row"], r["sample"]): r for r in records}


def parity(args: argparse.Namespace) -> None:
    with start_service(0) as server:
        for engine in args.engines.split(","):
            outs, seconds = {}, {}
            for mode in ("sync", "async"):
                outs[mode] = Path(args.out) / f"parity-{engine}-{mode}"
                if outs[mode].exists():
                    subprocess.run(["rm", "-rf", str(outs[mode])], check=True)
                seconds[mode] = evaluate(server.url, engine, mode, outs[mode])
            a, b = trajectories(outs["sync"]), trajectories(outs["async"])
            differ = [key for key in a if a[key]["response"] != b[key]["response"]]
            em = {mode: np.mean([r["em"] for r in t.values()]) for mode, t in (("sync", a), ("async", b))}
            print(f"{engine}: {len(a)} questions; evaluate wall sync {seconds['sync']:.1f} s, async "
                  f"{seconds['async']:.1f} s; EM sync {em['sync']:.3f}, async {em['async']:.3f}; "
                  f"{len(differ)} trajectories differ: {differ[:10]}")
            for key in differ[:3]:
                print(f"  row {key}: sync {a[key]['response'][-160:]!r}\n          async {b[key]['response'][-160:]!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--delays", default="0,300,1000", help="retrieval delays in ms, comma-separated")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=str(ROOT / "outputs/bench_async"))
    p.add_argument("--resume", action="store_true",
                   help="reuse runs under --out that completed --steps steps (after an interrupted benchmark)")
    p.add_argument("--parity", action="store_true", help="compare sync and async evaluation instead")
    p.add_argument("--engines", default="hf,vllm", help="--parity: engines to compare")
    p.add_argument("overrides", nargs="*", help="extra trainer config overrides key=value")
    args = p.parse_args()
    if not (DEMO / "tiny_policy" / "config.json").exists():
        raise SystemExit(f"no demo policy in {DEMO / 'tiny_policy'}: run `make demo` once first")
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    parity(args) if args.parity else bench(args)


if __name__ == "__main__":
    main()
