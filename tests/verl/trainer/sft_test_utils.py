"""Shared by the SFT tests: scripted search trajectories over a toy corpus, written as SFT parquet, and a tiny
model whose tokenizer knows their words."""

from __future__ import annotations

from pathlib import Path

from data_prep.cold_start import SFT_SCHEMA, rows_to_sft_parquet, sft_row
from data_prep.qa_search import make_row
from data_prep.tiny_model import save_tiny_model
from search_r1.llm_agent.formatting import information_turn, policy_turn
from search_r1.prompts import make_prompt

SEARCH = "<think> I need to search. </think><search> {q} </search>"
ANSWER = "<think> Found it. </think><answer> {a} </answer>"
TEMPLATE = "Search, then answer: {question}\n"  # a short instruction: short rows train fast

__all__ = ["ANSWER", "SEARCH", "SFT_SCHEMA", "TEMPLATE", "question", "scripted_rows", "tiny_sft_model", "write_rows"]


def question(i: int) -> str:
    return f"Who founded the guild number {i} of Vuzaholm"


def passage(i: int) -> dict:
    return {"id": str(i), "contents": f'"Guild {i}"\nThe guild number {i} of Vuzaholm was founded by Arlen Tosk {i}.'}


def scripted_rows(indices: range | list[int]) -> list[dict]:
    """One search-then-answer trajectory per question index, as SFT rows."""
    rows = []
    for i in indices:
        turns = [policy_turn(SEARCH.format(q=question(i))), information_turn([passage(i)]),
                 policy_turn(ANSWER.format(a=f"Arlen Tosk {i}"))]
        rows.append(sft_row(make_row("toy", question(i), [f"Arlen Tosk {i}"], "train", i, TEMPLATE), turns))
    return rows


def write_rows(rows: list[dict], path: Path) -> Path:
    rows_to_sft_parquet(rows, path)
    return path


def tiny_sft_model(root: Path) -> Path:
    """A random tiny Qwen2 model (2 layers, hidden 64) with a tokenizer trained on the trajectories' texts."""
    rows = scripted_rows(range(40))
    texts = [make_prompt(question(i), TEMPLATE) for i in range(40)]
    texts += ["".join(t["text"] for t in r["turns"]) for r in rows]
    return save_tiny_model(root / "model", texts * 2, vocab_size=700, hidden_size=64, num_heads=1)
