"""The real-data build's figures, measured again: answer-bearing questions and retrieval with the raw question.

    python benchmarks/wiki_nq_figures.py --data data/wiki_nq [--topk 3]

Reads a build of ``python -m data_prep.wiki_nq`` (its corpus, its BM25 and dense indexes) and the question files
its manifest names (the copy shipped in data_prep/real/nq_open). For NQ-open dev and EfficientQA dev it prints:

- ``answer-bearing``: questions with a golden answer in some passage (Search-R1's sub-EM against the passage,
  title included: ``data_prep.wiki_corpus.AnswerFinder``), counted again here from the corpus file;
- ``BM25 top-k`` / ``dense top-k``: questions for which the retrieval service, given the raw question, returns a
  passage holding a golden answer among its top ``k``. Each index is served by the real service
  (``retrieval_server.serve``) on a loopback port and queried over HTTP, as the agent queries it.

The first is what a policy could ever find; the others what retrieval with the question alone finds, the
baseline a policy that rewrites its queries and searches again has to beat.

A second table counts the answer-bearing questions under two other definitions, to show which one issue 59's
figures used: sub-EM against the extract without its title, and a plain substring test of the normalised answer
(FlashRAG's sub-EM, no token boundaries: "4" is found in "1945") against title and extract.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data_prep.wiki_corpus import AnswerFinder  # noqa: E402
from data_prep.wiki_nq import QUESTION_FILES, SHIPPED_QUESTIONS, read_questions  # noqa: E402
from retrieval_server.launcher import ServerProcess  # noqa: E402
from search_r1.reward.qa_em import golden_list, normalize_answer, subem_check  # noqa: E402
from verl.utils.progress import progress  # noqa: E402

BATCH = 256  # questions per /retrieve request


def gold_found(client: httpx.Client, url: str, queries: list[str], golds: list[list[str]],
               desc: str | None = None) -> list[bool]:
    """Per query: do the top passages the service at ``url`` returns for it hold one of its golden answers?"""
    found: list[bool] = []
    for start in progress(range(0, len(queries), BATCH), desc=desc, unit="batch", disable=desc is None):
        result = client.post(url + "/retrieve", json={"queries": queries[start:start + BATCH]})
        result.raise_for_status()
        found += [any(subem_check(p["contents"], gold) for p in passages)
                  for passages, gold in zip(result.json()["result"], golds[start:start + BATCH], strict=True)]
    return found


def retrieved_hits(index_dir: Path, corpus: Path, questions: list, topk: int) -> int:
    """Questions whose top ``topk`` passages from the service over ``index_dir`` hold a golden answer."""
    with ServerProcess(index_dir, corpus, ["--topk", str(topk), "--max-topk", str(topk)]) as server:
        server.wait_ready(timeout=600)
        with httpx.Client(timeout=600) as client:
            return sum(gold_found(client, server.url, [q.text for q in questions], [q.answers for q in questions],
                                  desc=index_dir.name))


def definitions_compared(passages: list[str], questions_per_split: dict[str, list]) -> list[dict]:
    """Answer-bearing counts per split under the build's definition and the two others (module docstring)."""
    extracts = AnswerFinder((p.split("\n", 1)[1] for p in passages), desc="extracts alone")
    joined = "\n".join(normalize_answer(p) for p in passages)  # an answer never holds a newline: no match spans two
    rows = []
    for label, bears in (("sub-EM, title + extract (the build's)", AnswerFinder(passages, desc="passages").bears),
                         ("sub-EM, extract alone", extracts.bears),
                         ("substring, title + extract", lambda answers: any(
                             gold in joined for gold in golden_list(answers, "squad")))):
        rows.append({"definition": label, **{name: sum(bears(q.answers) for q in questions)
                                             for name, questions in questions_per_split.items()}})
    return rows


def print_table(rows: list[dict]) -> None:
    print("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(f"{v:,}" if isinstance(v, int) else v for v in row.values()) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("data/wiki_nq"), help="output folder of data_prep.wiki_nq")
    p.add_argument("--topk", type=int, default=3, help="passages retrieved per question (default 3)")
    args = p.parse_args(argv)
    manifest = json.loads((args.data / "manifest.json").read_text())
    corpus = args.data / "corpus.jsonl"
    passages = [json.loads(line)["contents"] for line in corpus.read_text().splitlines()]
    finder = AnswerFinder(passages)
    questions_per_split = {name: read_questions(SHIPPED_QUESTIONS / file) for name, file in QUESTION_FILES.items()}
    rows = []
    for name, questions in questions_per_split.items():
        row = {"split": name, "questions": len(questions), "answer-bearing": sum(finder.bears(q.answers)
                                                                                for q in questions)}
        for kind in ("bm25", "dense"):
            row[f"{kind} top-{args.topk}"] = retrieved_hits(args.data / kind, corpus, questions, args.topk)
        rows.append(row)
    compared = definitions_compared(passages, questions_per_split)
    corpus_input = manifest["inputs"]["corpus"]
    print(f"\n{len(finder):,} passages ({corpus_input['package']} {corpus_input['version']}), build {args.data}")
    print_table(rows)
    print("\nanswer-bearing questions under three definitions:")
    print_table(compared)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
