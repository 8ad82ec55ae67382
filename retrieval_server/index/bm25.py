"""Sparse retrieval: BM25 with ``bm25s`` (scores precomputed into a sparse matrix, numba top-k).

Choices:
- bm25s defaults: the Lucene BM25 variant with k1=1.5, b=0.75 (the scorer Pyserini, used by
  Search-R1's BM25 retriever, implements).
- One ``bm25s`` Tokenizer for passages and queries: lower-cased words of 2+ word characters, English
  stopwords removed, no stemming (so no PyStemmer dependency). Its vocabulary is saved with the
  index; query words outside it are dropped.
- A query with no indexed word scores 0 on every passage and gets k arbitrary passages with score 0
  (passages with no indexed word are stored empty, so the tokenizer's "empty" token matches none).
- Retrieval uses the numba backend; ``threads=1`` selects its serial kernel, which releases the GIL.
- bm25s is imported with JAX hidden (``devices.jax_hidden``): bm25s imports JAX at import time where it is installed
  and runs a top-k with it, which takes 75 % of the first GPU; our search never uses it (numba's top-k).
  bm25s JIT-compiles its kernels without numba's on-disk cache, which costs seconds to tens of seconds at
  every server start (measured figures: docs/results.md); ``_cache_numba_kernels`` turns that cache on for the two
  retrieval kernels, so only the first start on a machine pays (numba invalidates the cache itself
  when bm25s's source or the CPU changes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from retrieval_server.devices import Placement, jax_hidden

with jax_hidden():  # bm25s/selection.py: `import jax.lax` at import time, then a top-k on the first GPU
    import bm25s
    from bm25s.numba import retrieve_utils
    from bm25s.tokenization import Tokenizer

logger = logging.getLogger(__name__)

BM25_DIR = "bm25"
STOPWORDS = "en"
TOKENIZE_CHUNK = 4096  # passages tokenised per call during the build


def build_bm25_index(passages: Iterable[str], count: int, out_dir: str | Path, progress: bool = True) -> dict:
    """Tokenise the passages (streamed, in corpus order), build and save the index under ``out_dir/bm25``.

    Returns the BM25 parameters (for the manifest).
    """
    tokenizer = Tokenizer(stopwords=STOPWORDS)
    ids_per_passage: list[list[int]] = []
    chunk: list[str] = []
    with tqdm(total=count, desc="tokenize", unit="passage", disable=not progress) as bar:
        for text in passages:
            chunk.append(text)
            if len(chunk) == TOKENIZE_CHUNK:
                ids_per_passage += tokenizer.tokenize(chunk, update_vocab=True, return_as="ids", show_progress=False)
                bar.update(len(chunk))
                chunk = []
        if chunk:
            ids_per_passage += tokenizer.tokenize(chunk, update_vocab=True, return_as="ids", show_progress=False)
            bar.update(len(chunk))
    empty_id = tokenizer.get_vocab_dict()[""]
    ids_per_passage = [[] if ids == [empty_id] else ids for ids in ids_per_passage]
    if len(ids_per_passage) != count:
        raise ValueError(f"expected {count} passages, got {len(ids_per_passage)}")

    retriever = bm25s.BM25(backend="numba")
    retriever.index((ids_per_passage, tokenizer.get_vocab_dict()), show_progress=progress)
    save_dir = Path(out_dir) / BM25_DIR
    retriever.save(str(save_dir), show_progress=False)
    tokenizer.save_vocab(str(save_dir))
    tokenizer.save_stopwords(str(save_dir))
    return {"k1": retriever.k1, "b": retriever.b, "method": retriever.method, "stopwords": STOPWORDS,
            "vocab_size": len(tokenizer.get_vocab_dict())}


def _cache_numba_kernels() -> None:
    """Store bm25s's compiled retrieval kernels (serial and parallel) in numba's on-disk cache."""
    retrieve_utils._retrieve_internal_jitted_serial.enable_caching()
    retrieve_utils._retrieve_internal_jitted_parallel.enable_caching()


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
        _cache_numba_kernels()
        save_dir = str(Path(index_dir) / BM25_DIR)
        retriever = bm25s.BM25.load(save_dir, show_progress=False, backend="numba")
        tokenizer = Tokenizer(stopwords=STOPWORDS)
        tokenizer.load_vocab(save_dir)
        tokenizer.load_stopwords(save_dir)
        return cls(retriever, tokenizer, threads if threads > 0 else (os.cpu_count() or 1))

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` float32 (descending) and row ids ``[B, k]`` int64."""
        # Never grows the vocabulary; a query with no known word becomes [id of ""], which no passage has.
        ids_per_query = self.tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
        rows, scores = self.retriever.retrieve(ids_per_query, k=k, show_progress=False, n_threads=self.threads)
        return scores, rows.astype(np.int64)
