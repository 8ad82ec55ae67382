"""BM25 retrieval in-process: scores equal a plain-loop Lucene BM25 over the same tokens."""

from __future__ import annotations

import math
import re

import numpy as np
from bm25s.stopwords import STOPWORDS_EN

from retrieval_server.search.bm25 import BM25Retriever
from tests.retrieval_server.retrieval_test_corpus import PASSAGES, RARE_TERM


def _tokens(text: str) -> list[str]:
    """The tokenizer the index promises: lower-case words of 2+ word characters, English stopwords dropped."""
    return [w for w in re.findall(r"(?u)\b\w\w+\b", text.lower()) if w not in STOPWORDS_EN]


def _lucene_bm25(query: str, docs: list[str], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """Plain loop: Lucene (>= 8) BM25, idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf part tf / (tf + k1 * norm)
    (Lucene dropped the constant (k1 + 1) factor; rankings are unchanged)."""
    doc_tokens = [_tokens(d) for d in docs]
    avgdl = sum(len(t) for t in doc_tokens) / len(doc_tokens)
    scores = []
    for tokens in doc_tokens:
        score = 0.0
        for term in set(_tokens(query)):
            df = sum(term in t for t in doc_tokens)
            if df == 0:
                continue
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            tf = tokens.count(term)
            score += idf * tf / (tf + k1 * (1 - b + b * len(tokens) / avgdl))
        scores.append(score)
    return scores


def test_scores_equal_a_plain_lucene_bm25(bm25_index):
    """Guards against a tokenizer mismatch between build and query (stopwords, case) or a vocabulary that
    shifts between save and load, either of which silently changes every score."""
    retriever = BM25Retriever.load(bm25_index, threads=1)
    contents = [f'"{title}"\n{text}' for _, title, text in PASSAGES]
    queries = ["Varnel River town", "glassmaker guild of Kelbrook", f"the {RARE_TERM} clock", "Sallow Sea sailors"]
    scores, rows = retriever.search(queries, k=len(PASSAGES))
    for query, row_scores, row_ids in zip(queries, scores, rows, strict=True):
        expected = _lucene_bm25(query, contents)
        got = np.zeros(len(PASSAGES))
        got[row_ids] = row_scores
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        assert list(row_scores) == sorted(row_scores, reverse=True)


def test_rare_term_ranks_its_passage_first(bm25_index):
    """Guards against the sparse index losing rare terms (e.g. a vocabulary cut) that BM25 exists to match."""
    retriever = BM25Retriever.load(bm25_index, threads=1)
    scores, rows = retriever.search([f"what chimes {RARE_TERM}", RARE_TERM.upper()], k=3)
    rare_row = [pid for pid, _, _ in PASSAGES].index("rare-0")
    assert rows[:, 0].tolist() == [rare_row, rare_row]
    assert (scores[:, 0] > scores[:, 1]).all()


def test_query_without_known_words_scores_zero(bm25_index):
    """Guards against unknown-word or all-stopword queries crashing the scorer or matching passages by accident."""
    retriever = BM25Retriever.load(bm25_index, threads=1)
    scores, rows = retriever.search(["the of and", "zzyzx unknownword", "river"], k=3)
    assert (scores[:2] == 0).all()
    assert scores[2, 0] > 0
    assert rows.shape == (3, 3) and ((rows >= 0) & (rows < len(PASSAGES))).all()
