"""A GRPO step of the real model at ``make demo-real``'s settings, engine by engine, side by side (issue 59).

    python benchmarks/bench_real_step.py [--steps 3] [--runs 1] [--variants hf-sync,vllm-sync,...]
                                         [--model outputs/demo_real/sft/hf_model] [--out outputs/bench_real_step]

Trains SmolLM2-135M-Instruct's cold start (``make demo-real``'s ``sft/hf_model``, built by ``make demo-real`` or
by ``scripts/demo_real.sh``) with GRPO on the demo knowledge base, 6 prompts x 4 samples a step, lr 1e-5, bfloat16
(``benchmarks/paper_table.py``'s RL settings and demo-real's lengths), against the real BM25 service. Variants:

    hf-sync      the HF engine (rollout.mode=sync: lockstep turns)
    hf-sync-full the same, every row's prompt computed in full (actor.share_prompt_prefix=false) and freed host
                 pages handed back after each micro-batch (trainer.host_memory=release): the step as the issue
                 measured it (its 65 s median), the baseline of the goal, except that the LM head runs on the read
                 tokens only, as in every variant since 57a095b (a little faster than the issue's step)
    vllm-sync-full  vLLM, every row's prompt in full
    vllm-sync    vLLM's CPU engine (rollout.name=vllm), lockstep turns
    vllm-sync-copy  the same, the actor's passes on a bfloat16 copy of its weights (actor.compute_weight_copy)
    hf-async     rows that finish make room for waiting trajectories: rollout.mode=async with the HF engine's
                 chunked rounds (rollout.async_chunk_tokens=64)
    vllm-async   the same with vLLM (continuous batching inside a round)
    vllm-async-copy  vllm-async with the weight copy: ``make demo-real``'s GRPO step until 2026-12-01
    vllm-async-budget  vllm-async-copy with token-budget micro-batches (actor.use_dynamic_bsz, 8192 tokens): rows
                 grouped by length, a step's few long rows apart from its short ones, fewer and larger micro-batches
    vllm-async-compiled-release  vllm-async-budget with the model compiled by torch.compile
                 (rollout.enforce_eager=false), freed host pages handed back (trainer.host_memory=release):
                 ``make demo-real``'s GRPO step on 2026-12-02 until freed host memory was kept for reuse
    vllm-async-compiled  the same with freed host memory kept for reuse (trainer.host_memory=reuse, the default
                 since then): ``make demo-real``'s GRPO step
    hf-k1        hf-async plus the one-step-off pipeline (trainer.max_staleness=1, actor.tis_cap=2)
    vllm-k1      vllm-async plus the one-step-off pipeline
    vllm-k1-compiled  vllm-async-compiled plus the one-step-off pipeline: the next batch generated while this one
                 trains (decoding one row is per-call overhead more than arithmetic, so the two can share the cores)
    vllm-k1-compiled-release  the same with freed host pages handed back (trainer.host_memory=release)

One fresh trainer process per (variant, run), the variants interleaved (run 1 of every variant, then run 2 in the
reverse order, ...), so a machine whose load or speed changes mid-benchmark affects all; the 1-minute load average
is printed before and after each run. Run k (from 0) trains with ``trainer.seed=1+k``: every variant of a run sees
the same prompts and seed, and a second run draws new samples (with one seed, a repeat samples the same rows again
and measures only the machine's noise).

Per variant: the step seconds (``timing/step``) of every step after the first (the first loads the engine and, with
k=1, has nothing to overlap; ``--steps 1`` counts its one step), their median, the medians of the step's phases
(generation, reference pass, update), and the ratio to the first variant's median (issue 59's goal against
``hf-sync-full``: <= 0.5). Beside them, the work the steps did: the median response length and how many steps had a
row cut at ``max_response_length``. Such a step waits for its longest row and pads the update to it (in ``make
demo-real`` it takes 1.5-2.5x the others), so two variants whose samples differ by chance differ by it: the median
over the steps with no row cut compares them at like work. ``--report`` prints the table again from every step
recorded under ``--out`` (an unfinished run's too). Figures belong in docs/results.md with the date, machine, load
and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.paper_table import DEMO_REAL_COMMON, GRPO, RL  # noqa: E402
from retrieval_server.launcher import ServerProcess  # noqa: E402

ASYNC = ["actor_rollout_ref.rollout.mode=async"]
K1 = ["trainer.max_staleness=1", "actor_rollout_ref.actor.tis_cap=2"]
COPY = ["actor_rollout_ref.actor.compute_weight_copy=true"]  # the actor's passes on a bfloat16 copy of its weights
BUDGET = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192"]
COMPILED = ["actor_rollout_ref.rollout.enforce_eager=false"]  # vLLM's model compiled when the engine starts
FULL = ["actor_rollout_ref.actor.share_prompt_prefix=false"]  # every row's prompt in full, as before 2026-12-01
RELEASE = ["trainer.host_memory=release"]  # freed host pages handed back after each micro-batch, as before 2026-12-02
VARIANTS = {
    "hf-sync": ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.mode=sync"],
    "hf-sync-full": ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.mode=sync", *FULL, *RELEASE],
    "vllm-sync-full": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=sync", *FULL],
    "vllm-sync": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=sync"],
    "vllm-sync-copy": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=sync", *COPY],
    "hf-async": ["actor_rollout_ref.rollout.name=hf", *ASYNC, "actor_rollout_ref.rollout.async_chunk_tokens=64"],
    "vllm-async": ["actor_rollout_ref.rollout.name=vllm", *ASYNC],
    "vllm-async-copy": ["actor_rollout_ref.rollout.name=vllm", *ASYNC, *COPY],
    "vllm-async-budget": ["actor_rollout_ref.rollout.name=vllm", *ASYNC, *COPY, *BUDGET],
    "vllm-async-compiled-release": ["actor_rollout_ref.rollout.name=vllm", *ASYNC, *COPY, *BUDGET, *COMPILED,
                                    *RELEASE],
    "vllm-async-compiled": ["actor_rollout_ref.rollout.name=vllm", *ASYNC, *COPY, *BUDGET, *COMPILED],
    "hf-k1": ["actor_rollout_ref.rollout.name=hf", *ASYNC, "actor_rollout_ref.rollout.async_chunk_tokens=64", *K1],
    "vllm-k1": ["actor_rollout_ref.rollout.name=vllm", *ASYNC, *K1],
    "vllm-k1-compiled-release": ["actor_rollout_ref.rollout.name=vllm", *ASYNC, *COPY, *BUDGET, *COMPILED, *K1,
                                 *RELEASE],
    "vllm-k1-compiled": ["actor_rollout_ref.rollout.name=vllm", *ASYNC, *COPY, *BUDGET, *COMPILED, *K1],
}
DEMO = ROOT / "data" / "demo"


PHASES = ("step", "gen", "ref", "update_actor")  # timing/<phase> of the trainer's metrics
WORK = {"cut": "agent/cut/max_response_length", "length": "response_length/mean"}  # what a step's rows did


def train(url: str, model: Path, variant: str, steps: int, seed: int, out: Path) -> dict[str, list[float]]:
    """One fresh run of ``steps`` steps -> per phase, the seconds of each step after the first (of the only one,
    with 1)."""
    shutil.rmtree(out, ignore_errors=True)  # metrics.jsonl appends: no earlier run's records
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *DEMO_REAL_COMMON, *RL, *GRPO, *VARIANTS[variant],
           f"actor_rollout_ref.model.path={model}", f"retriever.url={url}", f"trainer.total_training_steps={steps}",
           f"data.train_files={DEMO / 'train.parquet'}", f"data.val_files={DEMO / 'test.parquet'}",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable", f"trainer.seed={seed}",
           f"trainer.default_local_dir={out}"]
    with out.with_suffix(".log").open("w") as f:
        status = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise SystemExit(f"{variant} failed (exit {status}); see {out.with_suffix('.log')}")
    return read_run(out, count_first=steps == 1)


def read_run(out: Path, count_first: bool = False) -> dict[str, list[float]]:
    """A run directory's metrics.jsonl -> per phase (and per WORK key), one value for each step after the first (each
    step with ``count_first``: a one-step benchmark)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    stepped = [r for r in records if "timing/step" in r]
    counted = [r for r in stepped if r["step"] > 1 or count_first]
    got = {key: [r.get(f"timing/{key}", 0.0) for r in counted] for key in PHASES}
    got.update({key: [r.get(name, 0.0) for r in counted] for key, name in WORK.items()})
    return got


def table(seconds: dict[str, dict[str, list[float]]]) -> str:
    """The markdown table of per-variant medians; the first variant is the ratio's baseline."""
    first = next(iter(seconds))
    base = statistics.median(seconds[first]["step"])
    uncut = {v: [s for s, n in zip(p["step"], p["cut"]) if n == 0] for v, p in seconds.items()}
    base_uncut = statistics.median(uncut[first]) if uncut[first] else float("nan")
    lines = [f"| variant | median step s | generation | reference | update | steps counted | steps with a row cut | "
             f"median response tokens | vs {first} | median step s, no row cut | vs {first}, no row cut |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for variant, phases in seconds.items():
        med = {key: statistics.median(values) for key, values in phases.items()}
        cut = sum(1 for n in phases["cut"] if n > 0)
        no_cut = statistics.median(uncut[variant]) if uncut[variant] else float("nan")
        lines.append(f"| {variant} | {med['step']:.1f} | {med['gen']:.1f} | {med['ref']:.1f} | "
                     f"{med['update_actor']:.1f} | {len(phases['step'])} | {cut} | {med['length']:.0f} | "
                     f"{med['step'] / base:.2f}x | {no_cut:.1f} | {no_cut / base_uncut:.2f}x |")
    return "\n".join(lines)


def report(out: Path, variants: list[str], count_first: bool, upto: int | None = None
           ) -> dict[str, dict[str, list[float]]]:
    """Every run under ``out`` (``<variant>_run<k>/metrics.jsonl``, k < ``upto`` when given), pooled per variant."""
    seconds = {}
    for variant in variants:
        index = {d: d.name.removeprefix(f"{variant}_run") for d in out.glob(f"{variant}_run*")}  # run k's "k"
        runs = sorted(d for d, k in index.items() if (d / "metrics.jsonl").is_file() and k.isdigit()
                      and (upto is None or int(k) < upto))
        if not runs:
            raise SystemExit(f"no run of {variant} under {out} (looked for {variant}_run*/metrics.jsonl)")
        pooled: dict[str, list[float]] = {}
        for run in runs:
            for key, values in read_run(run, count_first).items():
                pooled.setdefault(key, []).extend(values)
        if not pooled.get("step"):
            raise SystemExit(f"{variant}: no step to count under {out}: its runs ({', '.join(d.name for d in runs)}) "
                             "recorded only their first step (counted with --steps 1)")
        print(f"[bench] {variant}: {len(runs)} run(s) from {out}", flush=True)
        seconds[variant] = pooled
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3,
                   help="steps per run; the first is not counted unless it is the only one (a quick look)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--first-run", type=int, default=0,
                   help="continue a benchmark under --out: its runs K.. (seed and order as if run from 0); the table "
                        "then pools runs 0.. found there")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--model", type=Path, default=ROOT / "outputs" / "demo_real" / "sft" / "hf_model")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_real_step")
    p.add_argument("--report", action="store_true",
                   help="train nothing: print the table from the runs under --out (with --steps 1: first steps too)")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or args.steps < 1 or args.runs < 1 or args.first_run < 0:
        p.error(f"variants must be among {', '.join(VARIANTS)} (got {unknown}); --steps >= 1; --runs >= 1; "
                "--first-run >= 0")
    if args.report:
        print(table(report(args.out, variants, count_first=args.steps == 1)))
        return 0
    if not (args.model / "config.json").exists() or not (DEMO / "index_bm25").exists():
        raise SystemExit(f"needs {args.model} and {DEMO}: run `make demo-real` (or scripts/demo_real.sh) once")
    seconds: dict[str, dict[str, list[float]]] = {v: {key: [] for key in (*PHASES, *WORK)} for v in variants}
    with ServerProcess(DEMO / "index_bm25", DEMO / "corpus.jsonl", ["--threads", "1"]) as server:
        server.wait_ready()
        for run in range(args.first_run, args.first_run + args.runs):
            # every other run in reverse order (A B, B A, ...): a machine that speeds up or slows down over the
            # benchmark then favours no variant
            for variant in (variants if run % 2 == 0 else variants[::-1]):
                before = os.getloadavg()[0]
                got = train(server.url, args.model, variant, args.steps, 1 + run, args.out / f"{variant}_run{run}")
                for key, values in got.items():
                    seconds[variant][key] += values
                print(f"[bench] {variant} run {run}: steps {', '.join(f'{s:.0f}' for s in got['step'])} s "
                      f"(load {before:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
    if args.first_run:
        seconds = report(args.out, variants, count_first=args.steps == 1, upto=args.first_run + args.runs)
    print(table(seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
