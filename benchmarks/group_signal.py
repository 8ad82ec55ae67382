"""What a GRPO group can learn from: do a question's samples differ in their queries, in what they retrieve, in EM?

    python benchmarks/group_signal.py DIR [DIR ...]

Each DIR is a training run's ``rollouts/`` folder (``N.jsonl`` per step; its train records are read) or an
evaluation directory of ``search_r1.evaluate --n K`` (K > 1: ``trajectories.jsonl``, sampled). A group is one
question's samples (the records' ``group``). Printed per DIR:

- ``groups``: groups of at least two samples, and the samples in all;
- ``queries = question``: the share of all queries that are the question itself (case and end punctuation aside);
- ``queries differ``: groups whose samples did not all send the same queries;
- ``retrieval differs``: groups in which some sample's passages hold a gold answer and another's do not (the
  ``retrieval_hit`` turn credit, ``adv_estimator=grpo_turn``, has something to compare only there);
- ``EM differs``: groups whose samples' scores are not all equal (GRPO's advantage is 0 in every other group).

The scripted cold start's first query is the question (``data_prep.cold_start``): a policy that copies it sends one
query per group, and no reward on retrieval can tell its samples apart (docs/results.md, "The paper's table").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_r1.eval_report import contains_gold, evidence  # noqa: E402

_QUESTION = re.compile(r"Question: (.*?)\s*(?:\n|<\|im_end\|>|$)")


def records(folder: Path) -> list[dict]:
    """The sampled trajectory records of a rollouts folder (train split) or an evaluation directory, each with
    ``response``, ``golden``, ``score``, ``queries``, ``group`` and ``question``."""
    if (folder / "trajectories.jsonl").exists():
        rows = [json.loads(line) for line in (folder / "trajectories.jsonl").read_text().splitlines()]
    else:
        rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
        rows = [r for r in rows if r.get("split", "train") == "train"]
        for r in rows:
            r.update(response=r["output"], golden=r["ground_truth"], prompt=r["input"])
    if not rows:
        raise SystemExit(f"{folder}: no trajectory records (a rollouts/ folder or an evaluation directory)")
    for r in rows:
        found = _QUESTION.search(r["prompt"])
        r["question"] = found.group(1) if found else ""
        r["group"] = f"{r.get('step')}/{r['group']}"  # a training question recurs in another step: another group
    return rows


def plain(text: str) -> str:
    return text.strip().strip("?.!").strip().lower()


def signal(rows: list[dict]) -> dict:
    """The figures of the module docstring over ``rows``."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
    groups = {k: g for k, g in groups.items() if len(g) > 1}
    queries = [(q, r["question"]) for g in groups.values() for r in g for q in r["queries"]]
    differ = {"queries_differ": 0, "retrieval_differs": 0, "em_differs": 0}
    for g in groups.values():
        differ["queries_differ"] += len({tuple(plain(q) for q in r["queries"]) for r in g}) > 1
        differ["retrieval_differs"] += len({contains_gold(evidence(r), r["golden"]) for r in g}) > 1
        differ["em_differs"] += len({float(r["score"]) for r in g}) > 1
    return {"groups": len(groups), "samples": sum(len(g) for g in groups.values()), "queries": len(queries),
            "question": sum(plain(q) == plain(question) for q, question in queries), **differ}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="+", type=Path, help="rollouts/ folders or evaluation directories (--n > 1)")
    args = p.parse_args(argv)
    print("| run | groups (samples) | queries = question | queries differ | retrieval differs | EM differs |\n"
          "|---|---|---|---|---|---|")
    for folder in args.dirs:
        s = signal(records(folder))
        share = s["question"] / max(1, s["queries"])
        print(f"| {folder} | {s['groups']} ({s['samples']}) | {s['question']} of {s['queries']} ({share:.2f}) | "
              f"{s['queries_differ']} | {s['retrieval_differs']} | {s['em_differs']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
