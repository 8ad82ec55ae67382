"""Loading an index directory into a ready-to-query search service (used by the server and benchmarks).

Choices:
- ``load_service`` does every check before the first query: the corpus checksum (in the same pass
  that records line offsets), then the encoder fingerprint (dense), then one warm-up query so that
  numba compilation and first-call allocations are not paid by a client.
- Both retrievers expose ``search(queries, k) -> (scores [B, k], row ids [B, k])``; the service
  turns row ids into passages (their corpus lines, as raw JSON). ``k`` is capped at the corpus size.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import numpy as np

from retrieval_server.bm25 import BM25Retriever
from retrieval_server.corpus import CorpusStore, scan_corpus
from retrieval_server.manifest import Manifest, check_corpus, check_encoder

logger = logging.getLogger(__name__)

Hit = tuple[bytes, float]  # (the passage's corpus line: a JSON object {"id", "contents"}, score)


class Retriever(Protocol):
    num_passages: int

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[B]`` queries -> scores ``[B, k]`` and row ids ``[B, k]`` (-1 = no hit), best first."""
        ...


def load_retriever(index_dir: str | Path, manifest: Manifest, model: str | None = None, threads: int = 0) -> Retriever:
    """The retriever the manifest describes. ``model`` overrides the manifest's encoder path (dense);
    ``threads`` > 0 caps the CPU threads of torch, FAISS and numba."""
    if manifest.retriever == "bm25":
        return BM25Retriever.load(index_dir, threads)
    import faiss

    from retrieval_server.dense import DenseRetriever
    from retrieval_server.encoder import Encoder

    if threads > 0:
        import torch

        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(threads)
    encoder = Encoder(model or manifest.model, manifest.query_prefix, manifest.passage_prefix)
    check_encoder(manifest, index_dir, encoder.name, encoder.fingerprint())
    return DenseRetriever.load(index_dir, manifest.index, manifest.index_params, encoder)


class SearchService:
    """A retriever plus the corpus it indexes: queries in, passages (with scores) out."""

    def __init__(self, retriever: Retriever, corpus: CorpusStore, manifest: Manifest):
        self.retriever = retriever
        self.corpus = corpus
        self.manifest = manifest

    @property
    def num_passages(self) -> int:
        return len(self.corpus)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top ``min(k, num_passages)`` hits per query, best first (fewer where an ANN index finds fewer)."""
        scores, rows = self.retriever.search(queries, min(k, self.num_passages))  # [B, k], [B, k]
        docs_per_query = self.corpus.fetch(rows)
        found = rows >= 0  # [B, k]; False where an approximate index found fewer than k
        if found.all():
            scores_per_query = scores.tolist()
        else:
            scores_per_query = [s[f].tolist() for s, f in zip(scores, found, strict=True)]
        return [list(zip(docs, s, strict=True)) for docs, s in zip(docs_per_query, scores_per_query, strict=True)]

    def close(self) -> None:
        self.corpus.close()


def load_service(index_dir: str | Path, corpus: str | Path, model: str | None = None,
                 threads: int = 0) -> SearchService:
    """Verify the index against ``corpus`` and the encoder, load it, and warm it up.

    Raises ``ManifestError`` saying which of corpus / encoder does not match.
    """
    manifest = Manifest.load(index_dir)
    logger.info("scanning corpus %s", corpus)
    scan = scan_corpus(corpus)
    check_corpus(manifest, index_dir, scan)
    logger.info("loading %s index from %s (%d passages)", manifest.retriever, index_dir, manifest.count)
    retriever = load_retriever(index_dir, manifest, model, threads)
    if retriever.num_passages != manifest.count:
        raise RuntimeError(f"index {index_dir} holds {retriever.num_passages} passages, manifest says {manifest.count}")
    service = SearchService(retriever, CorpusStore(scan), manifest)
    service.search(["warm-up query"], 1)
    logger.info("index ready")
    return service
