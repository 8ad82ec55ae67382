"""Where the errors of an ablation come from: a search that missed the evidence, or an answer that missed it.

    python benchmarks/error_analysis.py [--out outputs/ablations] [--variants ppo grpo ...]

Reads the greedy test evaluations that ``benchmarks/ablations.py`` wrote (``OUT/seedS/VARIANT/eval/
trajectories.jsonl``, one record per test question with its response and gold answers) and prints, per variant
and question type (one-hop / two-hop), mean and spread over seeds of:

- ``gold retrieved``: the share of questions where some ``<information>`` block of the trajectory contains a
  gold answer (normalised as exact match normalises: the same test as the ``retrieval_hit`` reward term);
- ``wrong, gold retrieved``: the share answered wrongly (EM 0) although a gold answer had been retrieved;
- ``wrong, not retrieved``: the share answered wrongly with no gold answer in any retrieved passage.

Search credit (turn rewards, retrieval-hit terms) can only fix the third kind; the second is the policy's
reading of what it found.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_r1.reward.qa_em import normalize_answer  # noqa: E402

INFO = re.compile(r"<information>(.*?)</information>", re.S)
TYPES = (("demo_single", "one-hop"), ("demo_multi", "two-hop"))


def contains_gold(text: str, golds: list[str]) -> bool:
    haystack = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(g)} " in haystack for g in golds if normalize_answer(g))


def shares(path: Path, source: str) -> tuple[float, float, float]:
    """(gold retrieved, wrong with gold, wrong without gold) over one evaluation's questions of ``source``."""
    rows = [json.loads(line) for line in path.open() if line.strip()]
    rows = [r for r in rows if r["data_source"] == source]
    if not rows:
        raise SystemExit(f"{path}: no questions of type {source!r}")
    hit = [contains_gold(" ".join(INFO.findall(r["response"])), r["golden"]) for r in rows]
    wrong = [r["em"] < 1 for r in rows]
    n = len(rows)
    return sum(hit) / n, sum(h and w for h, w in zip(hit, wrong)) / n, sum(w and not h for h, w in zip(hit, wrong)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/ablations"))
    parser.add_argument("--variants", nargs="+", default=None, help="default: every variant evaluated in OUT")
    args = parser.parse_args()
    seeds = sorted(p for p in args.out.glob("seed*") if p.is_dir())
    if not seeds:
        raise SystemExit(f"{args.out}: no seed directories (run benchmarks/ablations.py --out {args.out} first)")
    evaluated = {p.parent.parent.name for s in seeds for p in s.glob("*/eval/trajectories.jsonl")}
    variants = args.variants or sorted(evaluated)
    print("| variant | type | gold retrieved | wrong, gold retrieved | wrong, not retrieved | seeds |")
    print("|---|---|---|---|---|---|")
    for variant in variants:
        files = [s / variant / "eval" / "trajectories.jsonl" for s in seeds]
        files = [f for f in files if f.exists()]
        if not files:
            raise SystemExit(f"{args.out}: no evaluation of variant {variant!r} in any seed")
        for source, label in TYPES:
            cols = list(zip(*(shares(f, source) for f in files)))
            cells = [f"{statistics.mean(c):.3f} +/- {statistics.stdev(c) if len(c) > 1 else 0.0:.3f}" for c in cols]
            print(f"| {variant} | {label} | {' | '.join(cells)} | {len(files)} |")


if __name__ == "__main__":
    main()
