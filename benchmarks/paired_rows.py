"""Two rows of the paper's table, question by question: which questions each gets right that the other does not.

    python benchmarks/paired_rows.py A B [C ...]   # each against A
    python benchmarks/paired_rows.py grpo_bm25/seed1 grpo_bm25_nomask/seed1 --out outputs/paper_table_vllm

Each argument is an evaluation directory of ``search_r1.evaluate`` (it holds ``trajectories.jsonl``, one greedy
sample per question), or a row of ``benchmarks/paper_table.py`` under ``--out``: ``NAME`` for a row without seeds
(``sft``, ``rag``), ``NAME/seedK`` for an RL row. Its ``eval/`` directory is read.

Two rows' intervals overlap when they differ by a few questions in 1,800; the paired figures say whether the
difference is more than noise. Printed per pair, on all questions and on the answer-bearing ones:

- ``only A`` / ``only B``: questions right (EM 1) in one row and wrong in the other;
- ``sign test p``: the exact two-sided binomial test of those discordant counts against an even split;
- ``B - A``: the paired EM difference with its 95 % percentile bootstrap interval over questions
  (``search_r1.eval_report.bootstrap_ci``: the table's resamples and seed).

The rows must hold the same questions (the same ``row`` indices and golds); otherwise the script names the
difference and stops.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.error_analysis import trajectories_file  # noqa: E402
from search_r1.eval_report import bootstrap_ci  # noqa: E402

DEFAULT_OUT = ROOT / "outputs" / "paper_table_vllm"


def resolve(arg: str, out: Path) -> Path:
    """The ``trajectories.jsonl`` an argument names (module docstring), or SystemExit naming what was looked for."""
    if Path(arg).exists():
        return trajectories_file(Path(arg))
    row = out / arg / "eval" / "trajectories.jsonl"
    if not row.is_file():
        raise SystemExit(f"{arg}: no evaluation found; looked for {arg} and {row} "
                         "(an evaluation directory, or a row NAME or NAME/seedK under --out)")
    return row


def scores(path: Path) -> dict[int, dict]:
    """Per question (the dataset ``row``): its EM and answer-bearing flag and golds. One sample per question."""
    by_row: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["row"] in by_row:
            raise SystemExit(f"{path}: question {r['row']} has more than one sample; pair greedy evaluations")
        by_row[r["row"]] = {"em": float(r["em"]), "bearing": bool(r.get("answer_bearing")), "golden": r["golden"]}
    if not by_row:
        raise SystemExit(f"{path}: no trajectory records")
    return by_row


def sign_test(only_a: int, only_b: int) -> float:
    """Exact two-sided sign test: P(a split at least this uneven | each discordant question a fair coin)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def pair(a: dict[int, dict], b: dict[int, dict], bearing_only: bool = False) -> dict:
    """The paired figures of the module docstring over the questions both rows hold (answer-bearing ones only when
    ``bearing_only``)."""
    if a.keys() != b.keys():
        missing = sorted(a.keys() ^ b.keys())
        raise SystemExit(f"the rows hold different questions ({len(missing)} in one only, e.g. {missing[:5]})")
    rows = sorted(q for q in a if a[q]["bearing"] or not bearing_only)
    for q in rows:
        if a[q]["golden"] != b[q]["golden"]:
            raise SystemExit(f"question {q} has different gold answers in the two rows: another test set")
    em_a = np.array([a[q]["em"] for q in rows])  # [N]
    em_b = np.array([b[q]["em"] for q in rows])  # [N]
    only_a, only_b = int(((em_a == 1) & (em_b < 1)).sum()), int(((em_b == 1) & (em_a < 1)).sum())
    return {"n": len(rows), "em_a": float(em_a.mean()), "em_b": float(em_b.mean()), "only_a": only_a,
            "only_b": only_b, "p": sign_test(only_a, only_b), "diff": float((em_b - em_a).mean()),
            "diff_ci": bootstrap_ci(em_b - em_a)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="evaluation directories or rows (NAME, NAME/seedK) under --out")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the table's output directory (default: %(default)s)")
    args = p.parse_args(argv)
    if len(args.rows) < 2:
        p.error("give at least two rows to pair")
    base_name, others = args.rows[0], args.rows[1:]
    paths = {name: resolve(name, args.out) for name in args.rows}  # every row found before anything is printed
    base = scores(paths[base_name])
    print(f"| A = {base_name} against B | questions | EM A / B | only A | only B | sign test p | B - A [95 %] |\n"
          "|---|---|---|---|---|---|---|")
    for name in others:
        other = scores(paths[name])
        for label, bearing_only in (("all", False), ("answer-bearing", True)):
            f = pair(base, other, bearing_only)
            print(f"| {name} | {label}: {f['n']} | {f['em_a']:.3f} / {f['em_b']:.3f} | {f['only_a']} | "
                  f"{f['only_b']} | {f['p']:.3g} | {f['diff']:+.3f} [{f['diff_ci'][0]:+.3f}, {f['diff_ci'][1]:+.3f}] |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
