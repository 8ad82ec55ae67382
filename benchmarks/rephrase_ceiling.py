"""How far a second search with a phrase of the question can lift retrieval recall on the real-data build.

    python benchmarks/rephrase_ceiling.py [--data data/wiki_nq] [--topk 3] [--phrases 8]

For the answer-bearing questions of each split of a ``data_prep.wiki_nq`` build (its QA parquet: train, val, test),
served by the real retrieval service over its BM25 index (``retrieval_server.serve`` on loopback, queried over HTTP
as the agent queries it), prints:

- ``question``: questions whose top ``k`` passages for the raw question hold a gold answer (the agent's recall when
  it searches the question once, as the cold start teaches);
- ``+ best phrase``: those, or whose top ``k`` for some one of the question's first ``--phrases`` phrases
  (``data_prep.cold_start.rephrasings``: runs of its content words) holds one: the ceiling of a policy that searches
  the question, then the right phrase of it (what ``cold_start --rephrase`` scripts, choosing with the gold answer);
- ``+ a phrase at random``: the expected count when the second query is one of those phrases drawn uniformly (a
  policy that learnt the protocol but not which phrase to choose);
- ``mix``: for a policy whose first query is the question or (with probability ``--mix``) one of its phrases drawn
  uniformly, searched once (what ``cold_start --phrase-first`` teaches), the expected questions it finds a gold
  answer for, and the expected GRPO groups of ``--group`` samples whose retrieval differs (some sample's passages
  hold a gold answer and some do not): the groups in which retrieval-hit turn credit has something to compare. With
  the question alone (mix 0) there are none.

Issue 59 asks for the agent's recall >= 1.5x the raw question's; these say how much of that rewriting with the
question's own words can give here, before any word the question lacks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.wiki_nq_figures import gold_found  # noqa: E402
from data_prep.cold_start import rephrasings  # noqa: E402
from retrieval_server.launcher import ServerProcess  # noqa: E402
from search_r1.prompts import DEFAULT_TEMPLATE, question_of  # noqa: E402


def answer_bearing(parquet: Path) -> list[tuple[str, list[str]]]:
    """(question, gold answers) of the split's answer-bearing rows (``extra_info.answer_bearing``; every train and
    validation row is)."""
    out = []
    for row in pq.read_table(parquet).to_pylist():
        if row["extra_info"].get("answer_bearing", True):
            question = question_of(row["prompt"][-1]["content"], DEFAULT_TEMPLATE)
            out.append((question, list(row["reward_model"]["ground_truth"]["target"])))
    return out


def mixed(question_hits: list[bool], phrase_hits: list[list[bool]], share: float, group: int) -> tuple[float, float]:
    """A policy searching once, the question or (with probability ``share``) one of its phrases drawn uniformly (a
    question without phrases: the question) -> (expected questions whose passages hold a gold answer, expected groups
    of ``group`` samples in which some sample's do and some sample's do not)."""
    found = differ = 0.0
    for hit, phrases in zip(question_hits, phrase_hits, strict=True):
        p = (1 - share) * hit + share * (sum(phrases) / len(phrases) if phrases else hit)
        found += p
        differ += 1 - p ** group - (1 - p) ** group
    return found, differ


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=ROOT / "data" / "wiki_nq", help="output folder of data_prep.wiki_nq")
    p.add_argument("--topk", type=int, default=3, help="passages per search (default 3, the table's)")
    p.add_argument("--phrases", type=int, default=8, help="phrases of each question tried (default 8, the table's "
                   "sft_rephrase cold start)")
    p.add_argument("--mix", type=float, default=0.5, help="share of first queries that are a phrase (default 0.5)")
    p.add_argument("--group", type=int, default=4, help="samples per GRPO group (default 4, the table's)")
    args = p.parse_args(argv)
    splits = {name: answer_bearing(args.data / "search_r1" / f"{name}.parquet") for name in ("train", "val", "test")}
    print(f"| split | answer-bearing | question | + best phrase | + a phrase at random | mix {args.mix}: found | "
          f"mix {args.mix}: groups of {args.group} that differ |\n|---|---|---|---|---|---|---|")
    with ServerProcess(args.data / "bm25", args.data / "corpus.jsonl",
                       ["--topk", str(args.topk), "--max-topk", str(args.topk)]) as server, \
            httpx.Client(timeout=600) as client:
        server.wait_ready(timeout=600)
        for name, rows in splits.items():
            first = gold_found(client, server.url, [q for q, _ in rows], [g for _, g in rows])
            phrases = [(i, phrase) for i, (q, _) in enumerate(rows) for phrase in rephrasings(q, args.phrases)]
            second = gold_found(client, server.url, [ph for _, ph in phrases], [rows[i][1] for i, _ in phrases])
            per_question: dict[int, list[bool]] = {}
            for (i, _), hit in zip(phrases, second, strict=True):
                per_question.setdefault(i, []).append(hit)
            best = sum(first[i] or any(per_question.get(i, [])) for i in range(len(rows)))
            random = sum(1.0 if first[i] else sum(per_question.get(i, [])) / max(1, len(per_question.get(i, [])))
                         for i in range(len(rows)))
            base = sum(first)
            found, differ = mixed(first, [per_question.get(i, []) for i in range(len(rows))], args.mix, args.group)
            print(f"| {name} | {len(rows):,} | {base} | {best} ({best / base:.2f}x) | {random:.0f} "
                  f"({random / base:.2f}x) | {found:.0f} | {differ:.0f} ({differ / len(rows):.1%}) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
