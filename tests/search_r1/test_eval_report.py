"""What an evaluation report gives beside EM (search_r1.eval_report): searches, the agent's retrieval recall, turns,
response length and the error classes per question, each with its 95% bootstrap interval, on all questions and on the
answer-bearing subset. Pure functions: compared with plain loops written here."""

from __future__ import annotations

import numpy as np
import pytest

from search_r1.eval_report import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, build_results, to_markdown

INFO = ("<information>Doc 1(Title: Paris) Paris is the capital of France. Doc 2(Title: Lyon) Lyon is a city."
        "</information>")
NOTHING = "<information>Doc 1(Title: Nile) The Nile is a river.</information>"


def record(row: int, answer: str, golden: list[str], response: str, *, searches: int = 1, turns: int = 2,
           tokens: int = 50, passages: str = "", bearing: bool | None = None, sample: int = 0) -> dict:
    em = float(answer.lower() in (g.lower() for g in golden))
    return {"row": row, "sample": sample, "data_source": "nq", "golden": golden, "answer": answer, "em": em,
            "subem": em, "f1": em, "searches": searches, "turns": turns, "response_tokens": tokens,
            "stop_reason": "answered", "response": f"{response}<answer> {answer} </answer>",
            "prompt_passages": passages, "answer_bearing": bearing}


RECORDS = [
    record(0, "Paris", ["Paris"], INFO, bearing=True),  # right, gold retrieved
    record(1, "Lyon", ["Paris"], INFO, searches=2, turns=3, tokens=80, bearing=True),  # misread: another name read
    record(2, "Rome", ["Paris"], INFO, tokens=30, bearing=True),  # misread: a name it did not read
    record(3, "Cairo", ["Egypt"], NOTHING, bearing=False),  # wrong, not retrieved
    # RAG: no search, the passages in the prompt are the evidence
    record(4, "Paris", ["Paris"], "", searches=0, turns=1, tokens=10, passages="Doc 1(Title: Paris) Paris is big.",
           bearing=True),
    record(5, "Oslo", ["Bergen"], "", searches=0, turns=1, tokens=12, passages="Doc 1(Title: Oslo) Oslo.",
           bearing=False),
]
# per question: (em, searches, turns, tokens, recall, wrong_retrieved, name_read, wrong_not_retrieved)
EXPECTED = {0: (1, 1, 2, 50, 1, 0, 0, 0), 1: (0, 2, 3, 80, 1, 1, 1, 0), 2: (0, 1, 2, 30, 1, 1, 0, 0),
            3: (0, 1, 2, 50, 0, 0, 0, 1), 4: (1, 0, 1, 10, 1, 0, 0, 0), 5: (0, 0, 1, 12, 0, 0, 0, 1)}
NAMES = ("em", "searches", "turns", "response_tokens", "recall", "wrong_retrieved", "name_read", "wrong_not_retrieved")


def plain_bootstrap(values: list[float]) -> list[float]:
    """The percentile bootstrap of the mean, written out: the same resamples from the same seed."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        picks = rng.integers(0, len(values), size=len(values))
        means.append(sum(values[i] for i in picks) / len(values))
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def test_each_row_reports_recall_counters_and_error_classes_with_intervals():
    """Guards against issue 59's rows reporting EM alone: the agent's retrieval recall (RAG's passages in the prompt
    counted as retrieved, a passage without the gold not), searches, turns, response length and the error classes
    must each come with the project's bootstrap interval, on all questions and on the answer-bearing subset."""
    results = build_results(RECORDS)
    for group, rows in (("overall", list(EXPECTED)), ("answer_bearing", [0, 1, 2, 4])):
        s = results[group]
        assert s["n"] == len(rows)
        for k, name in enumerate(NAMES):
            values = [float(EXPECTED[r][k]) for r in rows]
            assert s[name] == pytest.approx(sum(values) / len(values)), (group, name)
            assert s[f"{name}_ci"] == pytest.approx(plain_bootstrap(values), abs=1e-9), (group, name)
    md = to_markdown(results, "t")
    assert "| answer-bearing | 4 |" in md and "retrieval recall" in md and "of which another name read" in md


def test_samples_of_one_question_are_averaged_and_no_flag_means_no_subset():
    """Guards against counting a question with k samples k times in recall (the unit is the question) and against an
    empty answer-bearing table for data without the flag."""
    records = [record(0, "Paris", ["Paris"], INFO, sample=0), record(0, "Lyon", ["Paris"], NOTHING, sample=1),
               record(1, "Cairo", ["Egypt"], NOTHING)]
    results = build_results(records)
    assert "answer_bearing" not in results
    overall = results["overall"]
    assert overall["recall"] == (0.5 + 0.0) / 2 and overall["em"] == (0.5 + 0.0) / 2
    assert overall["wrong_not_retrieved"] == (0.5 + 1.0) / 2
