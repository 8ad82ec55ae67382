"""Sparse search: queries tokenised as the passages were, scored with BM25 (``index/bm25.py`` builds and reads the
index and says how).

Choices:
- Retrieval uses bm25s's numba backend; ``threads=1`` selects its serial kernel, which releases the GIL.
- A query word outside the index's vocabulary is dropped, never added; a query with no known word scores 0
  everywhere (``search``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retrieval_server.index.bm25 import load_bm25
from retrieval_server.search.devices import Placement

if TYPE_CHECKING:
    import bm25s
    from bm25s.tokenization import Tokenizer


class BM25Retriever:
    """Tokenise queries, score with BM25: ``search(queries, k)`` -> (scores, row ids)."""

    def __init__(self, retriever: bm25s.BM25, tokenizer: Tokenizer, threads: int):
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.threads = threads
        self.num_passages = int(retriever.scores["num_docs"])
        self.placements: list[Placement] = []  # where the index runs (the CPU): set by service.load_retriever

    @classmethod
    def load(cls, index_dir: str | Path, threads: int = 0) -> BM25Retriever:
        """``threads`` = 0: all cores; 1: the serial numba kernel."""
        retriever, tokenizer = load_bm25(index_dir)
        return cls(retriever, tokenizer, threads if threads > 0 else (os.cpu_count() or 1))

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` float32 (descending) and row ids ``[B, k]`` int64."""
        # Never grows the vocabulary; a query with no known word becomes [id of ""], which no passage has.
        ids_per_query = self.tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
        rows, scores = self.retriever.retrieve(ids_per_query, k=k, show_progress=False, n_threads=self.threads)
        return scores, rows.astype(np.int64)
