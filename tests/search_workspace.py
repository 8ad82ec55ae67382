"""A small search task on disk, shared by the tests that run the launchers or the trainer against a real service:
eight passages (``corpus.jsonl``) and their BM25 index (``index/``), four questions answered by them as Search-R1
parquet (``data/train.parquet``, ``data/test.parquet``) and a tiny policy trained on nothing (``model/``)."""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import save_tiny_model
from retrieval_server.index.build import build_index
from search_r1.prompts import make_prompt


def build_search_workspace(root: Path, data_source: str = "toy") -> Path:
    passages = [f'"Guild {i}"\nThe guild number {i} of Vuzaholm was founded by Arlen Tosk {i}.' for i in range(8)]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": p}) + "\n"
                                               for i, p in enumerate(passages)))
    build_index(root / "corpus.jsonl", root / "index", retriever="bm25")
    questions = [f"Who founded the guild number {i} of Vuzaholm" for i in range(4)]
    save_tiny_model(root / "model", [make_prompt(q) for q in questions] * 4, vocab_size=600)
    rows = [make_row(data_source, q, [f"Arlen Tosk {i}"], "train", i) for i, q in enumerate(questions)]
    (root / "data").mkdir(exist_ok=True)
    rows_to_parquet(rows, root / "data" / "train.parquet")
    rows_to_parquet(rows, root / "data" / "test.parquet")
    return root
