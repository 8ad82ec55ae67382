"""Rejection-sampled rollouts (``python -m data_prep.cold_start rft``): a tiny policy that memorised a
search-then-answer trajectory per question, sampled by the training loop (HF engine) against the real retrieval
service; only its exact-match trajectories are kept, in the loop's own turns."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from search_r1.reward.qa_em import em_check, extract_answer
from tests.entry_points import in_process
from tests.search_r1.conftest import corpus_texts, policy, retrieval_index, service_url  # noqa: F401 (fixtures)
from tests.search_r1.memorised_policy import QUESTIONS, TOPK

pytestmark = pytest.mark.slow  # the retrieval service runs in its own process

FRANCE, TOKYO = QUESTIONS  # the policy answers Paris / Japan after one search
# each question once with a gold answer the policy gives and once with one it never gives
ROWS = [(FRANCE, ["Paris"]), (TOKYO, ["Japan"]), (FRANCE, ["Lyon"]), (TOKYO, ["Nippon"])]


def test_rejection_keeps_only_exact_matches(policy, service_url, tmp_path):  # noqa: F811 (fixtures)
    """At a low temperature the samples are (nearly) the memorised trajectories: right for the first two rows, wrong
    for the last two, whose gold answers the policy never gives. Guards against keeping rollouts whose answer is
    wrong (or missing), which would train the policy on its own mistakes, and against turns that are not the loop's
    (sampled text and inserted passages, in order)."""
    rows_to_parquet([make_row("toy", q, golds, "train", i) for i, (q, golds) in enumerate(ROWS)],
                    tmp_path / "qa.parquet")
    out = tmp_path / "rft.parquet"
    done = in_process("data_prep.cold_start", "rft", "--model", policy[0], "--data", tmp_path / "qa.parquet",
                      "--retriever-url", service_url, "--topk", TOPK, "--out", out, "--n", "2", "--temperature",
                      "0.05", "--batch-size", "8")
    assert done.returncode == 0, done.stderr
    kept = pq.read_table(out).to_pylist()
    assert kept and {r["extra_info"]["index"] for r in kept} <= {0, 1}, [r["extra_info"] for r in kept]
    assert "wrong answer: " in done.stdout and done.stdout.startswith(f"kept {len(kept)} of 8 (exact_match: ")
    for row in kept:
        turns = row["turns"]
        assert [t["sampled"] for t in turns] == [True, False, True]  # search, passages, answer (as memorised)
        assert turns[1]["text"].startswith("\n\n<information>Doc 1(Title: ")
        answer = extract_answer("".join(t["text"] for t in turns if t["sampled"]))
        assert em_check(answer, row["reward_model"]["ground_truth"]["target"]) == 1.0
    assert len({tuple(t["text"] for t in r["turns"]) for r in kept}) == len(kept)  # no duplicates
