"""Optional second stage: a cross-encoder rescores the first stage's candidates (Search-R1's rerank server).

Choices:
- Any local sentence-transformers ``CrossEncoder`` directory (a sequence-classification model with
  one output, e.g. an MS MARCO MiniLM cross-encoder): it reads query and passage together, which
  ranks better than comparing two independent embeddings, at the cost of one forward pass per
  (query, candidate) pair, so it only sees the first stage's top ``rerank_topk``.
- The passage text it reads is the corpus ``contents`` (title line + text), as indexed.
- The returned scores are the cross-encoder's (after its default activation: a sigmoid for one
  output), best first; ties keep the first stage's order (stable sort).
- It runs in fp32 on ``--encoder-device`` (the CPU unless asked; ``--encoder-dtype`` was checked for the encoder
  only).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from retrieval_server.search.devices import Placement

logger = logging.getLogger(__name__)


class RerankerError(RuntimeError):
    """The reranker path does not hold a usable cross-encoder."""


class Reranker:
    """A cross-encoder: ``rerank`` keeps the top ``k`` of each query's candidates by its scores."""

    def __init__(self, path: str, batch_size: int = 64, device: str = "cpu", threads: int = 0):
        if not Path(path).is_dir():
            raise RerankerError(f"reranker {path} is not a directory; give a local cross-encoder saved with "
                                "save_pretrained (a sequence-classification model with one output)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import CrossEncoder

        self.path = path
        self.batch_size = batch_size
        self.placement: Placement | None = None  # its device and what it took there: set by service.load_service
        import torch

        if threads > 0:  # the service's --threads (0: torch's default)
            torch.set_num_threads(threads)
        self.model = CrossEncoder(path, device=device, model_kwargs={"dtype": torch.float32})
        if self.model.num_labels != 1:
            raise RerankerError(f"reranker {path} gives {self.model.num_labels} scores per (query, passage) pair; "
                                "a reranker must give one (num_labels=1)")
        logger.info("reranker %s loaded on %s", path, self.model.device)

    def score(self, queries: list[str], passages_per_query: list[list[str]]) -> list[np.ndarray]:
        """One float32 score per (query, passage) pair, ``[n_i]`` per query."""
        pairs = [(query, passage) for query, passages in zip(queries, passages_per_query, strict=True)
                 for passage in passages]
        flat = np.asarray(self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False,
                                             convert_to_numpy=True), dtype=np.float32).reshape(-1)  # [pairs]
        out, start = [], 0
        for passages in passages_per_query:
            out.append(flat[start:start + len(passages)])
            start += len(passages)
        return out

    def rerank(self, queries: list[str], rows: np.ndarray, lines_per_query: list[list[bytes]],
               k: int) -> tuple[np.ndarray, np.ndarray]:
        """Candidates ``rows`` ``[B, K]`` (best first, -1 = none) with their corpus lines (the found ones, in
        order) -> cross-encoder scores ``[B, k]`` and row ids ``[B, k]``, best first; -1 / -inf pad a query
        with fewer than ``k`` candidates."""
        passages_per_query = [[json.loads(line)["contents"] for line in lines] for lines in lines_per_query]
        scores_per_query = self.score(queries, passages_per_query)
        out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)  # [B, k]
        out_rows = np.full((len(queries), k), -1, dtype=np.int64)  # [B, k]
        for i, scores in enumerate(scores_per_query):
            candidates = rows[i][rows[i] >= 0]  # [n_i], the order the lines came in
            order = np.argsort(-scores, kind="stable")[:k]  # ties keep the first stage's order
            out_scores[i, :len(order)] = scores[order]
            out_rows[i, :len(order)] = candidates[order]
        return out_scores, out_rows
