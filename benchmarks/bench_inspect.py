"""How long ``search-r1-inspect`` takes on a large run, and how large its page is (figures, not pass/fail).

    python benchmarks/bench_inspect.py [--steps 200] [--rows 256] [--limit 300] [--out DIR]

Writes a synthetic run directory of ``--steps`` files ``rollouts/<step>.jsonl`` of ``--rows`` trajectory records
each (a Search-R1 prompt, three turns with two inserted blocks of five passages: about 7.5 KB per record, the size
of a long real trajectory), then times, each in a fresh process: the page of a ``--limit`` sample, ``--text``, and
one step's page. Prints the run's size, each wall time and the page's size.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSAGE = "Doc {k}(Title: Guild {i}) The guild number {i} of Vuzaholm was founded by Arlen Tosk {i} in the year {y}. "


def record(step: int, row: int, rng: random.Random) -> dict:
    """One trajectory record of about 7.5 KB."""
    segments = []
    for turn in range(3):
        think = f"<think> I need to find who founded guild {row}, attempt {turn} </think>"
        if turn < 2:
            segments.append({"kind": "policy", "text": f"{think}<search> guild {row} founder </search>", "tokens": 30})
            info = "".join(PASSAGE.format(k=k, i=rng.randrange(1000), y=rng.randrange(1900, 2000)) * 3
                           for k in range(1, 6))
            segments.append({"kind": "inserted", "text": f"\n\n<information>{info}</information>\n\n", "tokens": 700})
        else:
            segments.append({"kind": "policy", "text": f"{think}<answer> Arlen Tosk {row} </answer>", "tokens": 25})
    em = float(rng.random() < 0.5)
    return {"step": step, "split": "train", "uid": f"row{row}/0", "group": f"row{row}", "index": row,
            "data_source": "nq", "input": f"Answer the question. ... Question: Who founded the guild number {row}?",
            "output": "".join(s["text"] for s in segments), "segments": segments,
            "queries": [f"guild {row} founder"] * 2, "answer": f"Arlen Tosk {row}",
            "ground_truth": [f"Arlen Tosk {row if em else row + 1}"], "score": em,
            "reward_terms": {"em": em, "f1": em, "format": 1.0}, "advantage": em - 0.5, "stop_reason": "answered",
            "num_searches": 2, "turns": 3, "response_length": sum(s["tokens"] for s in segments)}


def write_run(root: Path, steps: int, rows: int) -> int:
    """The synthetic run under ``root``; returns its size in bytes."""
    rng = random.Random(0)
    (root / "rollouts").mkdir(parents=True)
    for step in range(1, steps + 1):
        (root / "rollouts" / f"{step}.jsonl").write_text("".join(json.dumps(record(step, row, rng)) + "\n"
                                                                 for row in range(rows)))
    return sum(p.stat().st_size for p in (root / "rollouts").iterdir())


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "search_r1.inspect", *args], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--out", type=Path, default=None, help="where to write the run (default: a temporary directory)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = (args.out or Path(tmp)) / "run"
        size = write_run(root, args.steps, args.rows)
        print(f"run: {args.steps} steps x {args.rows} trajectories = {args.steps * args.rows:,} records, "
              f"{size / 2**20:,.0f} MiB")
        page = root.parent / "page.html"
        seconds = timed([str(root), "--out", str(page), "--limit", str(args.limit)])
        print(f"page of a {args.limit}-trajectory sample: {seconds:.1f} s, {page.stat().st_size / 2**20:.1f} MiB")
        print(f"--text (the list of the sample): {timed([str(root), '--text', '--limit', str(args.limit)]):.1f} s")
        seconds = timed([str(root), "--step", str(args.steps), "--out", str(page)])
        print(f"one step's page (--step {args.steps}, {args.rows} trajectories): {seconds:.1f} s, "
              f"{page.stat().st_size / 2**20:.1f} MiB")

if __name__ == "__main__":
    main()
