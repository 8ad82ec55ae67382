"""The paper table's PPO step on the real model, as it was and as it is, side by side (issue 59: a PPO row must fit).

    python benchmarks/bench_ppo_row_step.py [--steps 2] [--runs 1] [--variants before,now]
                                            [--model outputs/paper_table_vllm/sft/hf_model] [--data data/wiki_nq]
                                            [--out outputs/bench_ppo_row_step]

Trains ``benchmarks/paper_table.py``'s ``ppo_bm25`` row (its lengths, RL and PPO settings, vLLM's CPU engine with
async rollout, 24 questions a step, one sample each) from the table's cold start (``OUT/sft/hf_model``, made by the
table's first RL row) on the Wikipedia train split, against the real BM25 service, for ``--steps`` steps, one fresh
trainer process per (variant, run), the variants interleaved. Variants:

    before   4-row micro-batches in batch order, and the critic's separate value pass before its update (the table's
             PPO as of 9d9adc9: ``use_dynamic_bsz`` off, ``config.computes_values_in_update`` forced off)
    now      the table's PPO: token-budget micro-batches (8192) for the actor and the critic, and the on-policy
             critic that measures the values in its update (no value pass)

Both make the same update (``tests/verl/trainer/test_ppo_trainer.py``: the token budget and the on-policy critic
each train like the other way); only the compute differs. Per variant: each counted step's seconds and phases
(``timing/*``: gen, values, update_critic, update_actor) and the median step; the first step is not counted unless it
is the only one (it loads the engine). The 1-minute load average is printed around each run: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.paper_table import COMMON, ENGINES, PPO, RL  # noqa: E402
from retrieval_server.launcher import ServerProcess  # noqa: E402

BUDGET = ("actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
# the trainer with the critic's value pass forced back on (no config key turns the on-policy critic off: it makes the
# same update)
TWO_PASS = ("import sys; import verl.trainer.ppo_trainer as t; assert hasattr(t, 'computes_values_in_update'); "
            "t.computes_values_in_update = lambda cfg: False; "
            "from verl.trainer.main_ppo import main; sys.exit(main(sys.argv[1:]))")
VARIANTS = {
    "before": ([sys.executable, "-c", TWO_PASS], [k for k in PPO if not k.startswith(BUDGET)]),
    "now": ([sys.executable, "-m", "verl.trainer.main_ppo"], list(PPO)),
}
PHASES = ("gen", "values", "update_critic", "update_actor", "sync")


def train(url: str, args: argparse.Namespace, variant: str, out: Path) -> list[dict]:
    """One fresh run -> the ``timing/*`` records of its counted steps."""
    if out.exists():
        raise SystemExit(f"{out} exists: pass another --out (metrics.jsonl appends)")
    program, ppo = VARIANTS[variant]
    data = args.data / "search_r1"
    cmd = [*program, *COMMON, *RL, *ENGINES["vllm"]["train"], *ppo, f"retriever.url={url}",
           f"actor_rollout_ref.model.path={args.model}", f"data.train_files={data / 'train.parquet'}",
           f"data.val_files={data / 'val.parquet'}", f"trainer.total_training_steps={args.steps}",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.seed=1",
           "data.seed=1", f"trainer.default_local_dir={out}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".log").open("w") as f:
        status = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise SystemExit(f"{variant} failed (exit {status}); see {out.with_suffix('.log')}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    counted = [r for r in records if "timing/step" in r and (r["step"] > 1 or args.steps == 1)]
    value_pass = {"timing/values" in r for r in counted}
    if value_pass != {variant == "before"}:  # the variant ran as named, or its figures mean nothing
        raise SystemExit(f"{variant}: the separate value pass ran in {sum(value_pass)} of {len(counted)} steps")
    return counted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2, help="steps per run; the first is not counted unless the only one")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--model", type=Path, default=ROOT / "outputs" / "paper_table_vllm" / "sft" / "hf_model")
    p.add_argument("--data", type=Path, default=ROOT / "data" / "wiki_nq")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_ppo_row_step")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or args.steps < 1 or args.runs < 1:
        p.error(f"variants must be among {', '.join(VARIANTS)} (got {unknown}); --steps >= 1; --runs >= 1")
    for needed, how in ((args.model / "config.json", "benchmarks/paper_table.py --rows sft (the cold start)"),
                        (args.data / "bm25", "python -m data_prep.wiki_nq --out DATA --no-dense")):
        if not needed.exists():
            raise SystemExit(f"needs {needed}: make it with {how}")
    records: dict[str, list[dict]] = {v: [] for v in variants}
    with ServerProcess(args.data / "bm25", args.data / "corpus.jsonl", ["--threads", "1"]) as server:
        server.wait_ready()
        for run in range(args.runs):
            for variant in variants:
                before = os.getloadavg()[0]
                steps = train(server.url, args, variant, args.out / f"{variant}_run{run}")
                records[variant] += steps
                shown = "; ".join(f"{r['timing/step']:.0f} s (" + ", ".join(
                    f"{ph} {r[f'timing/{ph}']:.0f}" for ph in PHASES if f"timing/{ph}" in r) + ")" for r in steps)
                print(f"[bench] {variant} run {run}: {shown} (load {before:.1f} -> {os.getloadavg()[0]:.1f})",
                      flush=True)
    base = statistics.median(r["timing/step"] for r in records["before"]) if records.get("before") else None
    print("| variant | median step s | " + " | ".join(f"median {ph} s" for ph in PHASES) +
          " | steps counted | vs before |\n|---|---|" + "---|" * len(PHASES) + "---|---|")
    for variant, steps in records.items():
        median = statistics.median(r["timing/step"] for r in steps)
        phases = [statistics.median(r.get(f"timing/{ph}", 0.0) for r in steps) for ph in PHASES]
        ratio = f"{median / base:.2f}x" if base else "-"
        print(f"| {variant} | {median:.1f} | " + " | ".join(f"{s:.1f}" for s in phases) +
              f" | {len(steps)} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
