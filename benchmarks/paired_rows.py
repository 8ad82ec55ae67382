"""Two rows of the paper's table, question by question: which questions each gets right that the other does not.

    python benchmarks/paired_rows.py A B [C ...]   # each against A
    python benchmarks/paired_rows.py grpo_bm25/seed1 grpo_bm25_nomask/seed1 --out outputs/paper_table_vllm

Each argument is an evaluation directory of ``search_r1.evaluate`` (it holds ``trajectories.jsonl``, one greedy
sample per question), a ``row.json``, or a row of ``benchmarks/paper_table.py``: ``NAME`` for a row without seeds
(``sft``, ``rag``), ``NAME/seedK`` for an RL row. A row is read from its ``eval/`` directory under ``--out``, else from
its ``row.json`` there, else from the copy kept in the repository (``--kept``): a ``row.json`` carries its per-question
EM (``per_question``, written by ``paper_table.py``), so finished rows pair on a machine that never held their
trajectories.

Two rows' intervals overlap when they differ by a few questions in 1,800; the paired figures say whether the
difference is more than noise. Printed per pair, on all questions and on the answer-bearing ones:

- ``only A`` / ``only B``: questions right (EM 1) in one row and wrong in the other;
- ``sign test p``: the exact two-sided binomial test of those discordant counts against an even split;
- ``B - A``: the paired EM difference with its 95 % percentile bootstrap interval over questions
  (``search_r1.eval_report.bootstrap_ci``: the table's resamples and seed).

The rows must hold the same questions (the same ``row`` indices, golds and answer-bearing flags: ``test_sha256``);
otherwise the script names the difference and stops.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_r1.eval_report import bootstrap_ci  # noqa: E402

DEFAULT_OUT = ROOT / "outputs" / "paper_table_vllm"
DEFAULT_KEPT = ROOT / "benchmarks" / "paper_table_rows" / "vllm"


@dataclass
class Scores:
    """One row's results per question (the dataset ``row``): ``{"em", "bearing", "golden"}`` (``golden`` None when
    read from a ``row.json``, which keeps only ``test_sha256``, the fingerprint of the questions' golds and flags)."""

    by_row: dict[int, dict]
    test_sha256: str


def resolve(arg: str, out: Path, kept: Path = DEFAULT_KEPT) -> Path:
    """The ``trajectories.jsonl`` or ``row.json`` an argument names (module docstring), or SystemExit naming every
    path looked at."""
    given = Path(arg)
    if given.is_file():
        return given
    candidates = [given / "trajectories.jsonl", given / "eval" / "trajectories.jsonl", given / "row.json"] \
        if given.is_dir() else []
    candidates += [out / arg / "eval" / "trajectories.jsonl", out / arg / "row.json", kept / arg / "row.json"]
    for path in candidates:
        if path.is_file() and (path.name != "row.json" or "per_question" in json.loads(path.read_text())):
            return path
    raise SystemExit(f"{arg}: no evaluation found; looked for {', '.join(str(c) for c in candidates)} (an evaluation "
                     "directory, or a row NAME or NAME/seedK under --out or --kept; a row.json counts only with its "
                     "per_question results, which rows kept before they were recorded lack)")


def fingerprint(by_row: dict[int, dict]) -> str:
    """sha256 of the questions' rows, golds and answer-bearing flags: equal only for the same test set."""
    text = json.dumps([[q, by_row[q]["golden"], by_row[q]["bearing"]] for q in sorted(by_row)])
    return hashlib.sha256(text.encode()).hexdigest()


def scores(path: Path) -> Scores:
    """A row's per-question results from a ``trajectories.jsonl`` (one sample per question) or a ``row.json``."""
    if path.name == "row.json":
        return from_row_json(path)
    by_row: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["row"] in by_row:
            raise SystemExit(f"{path}: question {r['row']} has more than one sample; pair greedy evaluations")
        by_row[r["row"]] = {"em": float(r["em"]), "bearing": bool(r.get("answer_bearing")), "golden": r["golden"]}
    if not by_row:
        raise SystemExit(f"{path}: no trajectory records")
    return Scores(by_row, fingerprint(by_row))


def per_question(trajectories: Path) -> dict:
    """What a ``row.json`` keeps of an evaluation so it can be paired later (``from_row_json`` reads it back): the
    question rows as ``[start, end)`` ranges and, one character per question in that order, EM ("1" right) and the
    answer-bearing flag, with ``test_sha256``. About 4 kB for 1,800 questions; the trajectories are about 4 MB."""
    s = scores(trajectories)
    if any(v["em"] not in (0.0, 1.0) for v in s.by_row.values()):
        raise SystemExit(f"{trajectories}: EM other than 0 or 1; per-question results keep exact match only")
    qs = sorted(s.by_row)
    ranges: list[list[int]] = []
    for q in qs:
        if ranges and ranges[-1][1] == q:
            ranges[-1][1] = q + 1
        else:
            ranges.append([q, q + 1])
    return {"rows": ranges, "em": "".join("1" if s.by_row[q]["em"] == 1 else "0" for q in qs),
            "answer_bearing": "".join("1" if s.by_row[q]["bearing"] else "0" for q in qs),
            "test_sha256": s.test_sha256}


def from_row_json(path: Path) -> Scores:
    """``per_question`` of a ``row.json`` back to per-question results (golds unknown: ``test_sha256`` stands in)."""
    record = json.loads(path.read_text()).get("per_question")
    if record is None:
        raise SystemExit(f"{path}: no per_question results (a row made before they were recorded); pair its "
                         "evaluation directory instead")
    qs = [q for start, end in record["rows"] for q in range(start, end)]
    if not len(qs) == len(record["em"]) == len(record["answer_bearing"]):
        raise SystemExit(f"{path}: per_question holds {len(qs)} rows, {len(record['em'])} EMs and "
                         f"{len(record['answer_bearing'])} flags; it is damaged")
    by_row = {q: {"em": float(e == "1"), "bearing": b == "1", "golden": None}
              for q, e, b in zip(qs, record["em"], record["answer_bearing"])}
    return Scores(by_row, record["test_sha256"])


def sign_test(only_a: int, only_b: int) -> float:
    """Exact two-sided sign test: P(a split at least this uneven | each discordant question a fair coin)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def pair(sa: Scores, sb: Scores, bearing_only: bool = False) -> dict:
    """The paired figures of the module docstring over the questions both rows hold (answer-bearing ones only when
    ``bearing_only``)."""
    a, b = sa.by_row, sb.by_row
    if a.keys() != b.keys():
        missing = sorted(a.keys() ^ b.keys())
        raise SystemExit(f"the rows hold different questions ({len(missing)} in one only, e.g. {missing[:5]})")
    if sa.test_sha256 != sb.test_sha256:
        named = [q for q in sorted(a) if None not in (a[q]["golden"], b[q]["golden"])
                 and (a[q]["golden"], a[q]["bearing"]) != (b[q]["golden"], b[q]["bearing"])]
        raise SystemExit((f"question {named[0]} has different gold answers or answer-bearing flags in the two rows"
                          if named else "the rows' test_sha256 differ: other gold answers or answer-bearing flags")
                         + ": another test set")
    rows = sorted(q for q in a if a[q]["bearing"] or not bearing_only)
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
    p.add_argument("--kept", type=Path, default=DEFAULT_KEPT,
                   help="finished rows kept in the repository, read where --out lacks a row (default: %(default)s)")
    args = p.parse_args(argv)
    if len(args.rows) < 2:
        p.error("give at least two rows to pair")
    base_name, others = args.rows[0], args.rows[1:]
    paths = {name: resolve(name, args.out, args.kept) for name in args.rows}  # every row found before printing
    base = scores(paths[base_name])
    for name, path in paths.items():
        print(f"{name}: {path}")
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
