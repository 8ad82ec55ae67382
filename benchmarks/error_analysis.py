"""Where the errors of a trained policy come from: a search that missed the evidence, or an answer that missed it.

    python benchmarks/error_analysis.py [--out outputs/ablations] [--variants ppo grpo ...]
    python benchmarks/error_analysis.py --runs LABEL=EVAL_DIR[,EVAL_DIR...] ...

Reads greedy test evaluations (``search_r1.evaluate --out EVAL_DIR`` writes ``EVAL_DIR/trajectories.jsonl``, one
record per test question with its response and gold answers). Without ``--runs`` it reads the layout of
``benchmarks/ablations.py`` (``OUT/seedS/VARIANT/eval/``, one directory per seed); with ``--runs`` each LABEL names
its evaluation directories (one per seed, comma-separated), e.g. ``grpo=runs/s1/eval,runs/s2/eval``. Both action
formats are read: the evidence is every ``<information>`` block (tag format) or ``<tool_response>`` block (hermes).

Prints, per run and question type (one-hop / two-hop), mean and spread over seeds of the share of questions:

- ``EM``: answered right;
- ``gold retrieved``: some evidence block of the trajectory contains a gold answer (normalised as exact match
  normalises: the same test as the ``retrieval_hit`` reward term);
- ``wrong, gold retrieved``: answered wrongly although a gold answer had been retrieved (a misreading);
- ``of which another name read``: those misreadings whose answer is itself a name from the retrieved evidence (the
  policy copied the wrong entity: the company for its founder, the town for the building);
- ``wrong, not retrieved``: answered wrongly with no gold answer in any retrieved evidence.

Search credit (turn rewards, retrieval-hit terms) can only fix the last kind; the others are the policy's reading
of what it found. The classes are ``search_r1.eval_report.error_classes`` (every evaluation's report gives them on
all questions, with intervals); this script sets them side by side over runs and seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_r1.eval_report import error_classes  # noqa: E402

TYPES = (("demo_single", "one-hop"), ("demo_multi", "two-hop"))
COLUMNS = ("EM", "gold retrieved", "wrong, gold retrieved", "of which another name read", "wrong, not retrieved")


@dataclass
class Shares:
    """Shares of one evaluation's questions of one type (see the module docstring)."""

    em: float
    retrieved: float
    wrong_retrieved: float
    wrong_name_read: float
    wrong_not_retrieved: float

    def row(self) -> tuple[float, ...]:
        return self.em, self.retrieved, self.wrong_retrieved, self.wrong_name_read, self.wrong_not_retrieved


def shares(path: Path, source: str) -> Shares:
    """The shares over one evaluation's (``trajectories.jsonl``) questions of ``source`` (the classes of
    ``search_r1.eval_report.error_classes``, which the evaluation's own report gives with intervals)."""
    rows = [json.loads(line) for line in path.open() if line.strip()]
    rows = [r for r in rows if r["data_source"] == source]
    if not rows:
        raise SystemExit(f"{path}: no questions of type {source!r}")
    n = len(rows)
    classes = [error_classes(r) for r in rows]
    return Shares(sum(r["em"] >= 1 for r in rows) / n,
                  *(sum(c[name] for c in classes) / n
                    for name in ("recall", "wrong_retrieved", "name_read", "wrong_not_retrieved")))


def trajectories_file(path: Path) -> Path:
    """An evaluation directory's ``trajectories.jsonl`` (or the file itself); exits naming the path if absent."""
    file = path / "trajectories.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise SystemExit(f"{path}: no trajectories.jsonl (give the --out directory of search_r1.evaluate)")
    return file


def parse_runs(specs: list[str]) -> dict[str, list[Path]]:
    """``LABEL=DIR[,DIR...]`` -> {label: [trajectories.jsonl per seed]}; exits naming a malformed spec."""
    runs: dict[str, list[Path]] = {}
    for spec in specs:
        label, sep, dirs = spec.partition("=")
        if not sep or not label or not dirs:
            raise SystemExit(f"--runs {spec!r}: expected LABEL=EVAL_DIR[,EVAL_DIR...]")
        runs[label] = [trajectories_file(Path(d)) for d in dirs.split(",") if d]
    return runs


def ablation_runs(out: Path, variants: list[str] | None) -> dict[str, list[Path]]:
    """The evaluations of ``benchmarks/ablations.py``'s output directory, per variant (one file per seed)."""
    seeds = sorted(p for p in out.glob("seed*") if p.is_dir())
    if not seeds:
        raise SystemExit(f"{out}: no seed directories (run benchmarks/ablations.py --out {out} first)")
    evaluated = {p.parent.parent.name for s in seeds for p in s.glob("*/eval/trajectories.jsonl")}
    runs = {}
    for variant in variants or sorted(evaluated):
        files = [f for f in (s / variant / "eval" / "trajectories.jsonl" for s in seeds) if f.exists()]
        if not files:
            raise SystemExit(f"{out}: no evaluation of variant {variant!r} in any seed")
        runs[variant] = files
    return runs


def table(runs: dict[str, list[Path]]) -> list[str]:
    """Markdown lines: per run and question type, each column's mean +/- standard deviation over seeds."""
    lines = [f"| run | type | {' | '.join(COLUMNS)} | seeds |", "|---|---|" + "---|" * (len(COLUMNS) + 1)]
    for label, files in runs.items():
        for source, name in TYPES:
            cols = list(zip(*(shares(f, source).row() for f in files)))
            cells = [f"{statistics.mean(c):.3f} +/- {statistics.stdev(c) if len(c) > 1 else 0.0:.3f}" for c in cols]
            lines.append(f"| {label} | {name} | {' | '.join(cells)} | {len(files)} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/ablations"), help="benchmarks/ablations.py's --out")
    parser.add_argument("--variants", nargs="+", default=None, help="default: every variant evaluated in OUT")
    parser.add_argument("--runs", nargs="+", default=None, metavar="LABEL=EVAL_DIR[,EVAL_DIR...]",
                        help="evaluation directories to read instead of OUT's (one per seed)")
    args = parser.parse_args(argv)
    runs = parse_runs(args.runs) if args.runs else ablation_runs(args.out, args.variants)
    print("\n".join(table(runs)))


if __name__ == "__main__":
    main()
