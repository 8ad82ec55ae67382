"""BM25 index files: written and read with ``bm25s`` (scores precomputed into a sparse matrix, numba top-k).

Choices:
- bm25s defaults: the Lucene BM25 variant with k1=1.5, b=0.75 (the scorer Pyserini, used by
  Search-R1's BM25 retriever, implements).
- One ``bm25s`` Tokenizer for passages and queries: lower-cased words of 2+ word characters, English
  stopwords removed, no stemming (so no PyStemmer dependency). Its vocabulary is saved with the
  index; query words outside it are dropped.
- A query with no indexed word scores 0 on every passage and gets k arbitrary passages with score 0
  (passages with no indexed word are stored empty, so the tokenizer's "empty" token matches none).
- bm25s is imported with JAX hidden (``jax_hidden``): bm25s imports JAX at import time where it is installed and
  runs a top-k with it, which takes 75 % of the first GPU; our search never uses it (numba's top-k). The rest of
  the service keeps JAX off the devices too (``search/devices.py``).
  bm25s JIT-compiles its kernels without numba's on-disk cache, which costs seconds to tens of seconds at
  every server start (measured figures: docs/results.md); ``_cache_numba_kernels`` turns that cache on for the two
  retrieval kernels, so only the first start on a machine pays (numba invalidates the cache itself
  when bm25s's source or the CPU changes).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm import tqdm


@contextlib.contextmanager
def jax_hidden() -> Iterator[None]:
    """Inside: ``import jax`` (and ``import jax.lax``) raise ImportError, whether JAX is installed or already imported;
    after: the process's own JAX modules, if it had any, are back in ``sys.modules``."""
    saved = {name: module for name, module in sys.modules.items() if name == "jax" or name.startswith("jax.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["jax"] = None  # type: ignore[assignment]  # Python's own marker: "import of jax halted"
    try:
        yield
    finally:
        if sys.modules.get("jax", 0) is None:
            del sys.modules["jax"]
        sys.modules.update(saved)


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


def load_bm25(index_dir: str | Path) -> tuple[bm25s.BM25, Tokenizer]:
    """The BM25 index under ``index_dir/bm25`` (numba backend, its kernels cached on disk) and its tokenizer."""
    _cache_numba_kernels()
    save_dir = str(Path(index_dir) / BM25_DIR)
    retriever = bm25s.BM25.load(save_dir, show_progress=False, backend="numba")
    tokenizer = Tokenizer(stopwords=STOPWORDS)
    tokenizer.load_vocab(save_dir)
    tokenizer.load_stopwords(save_dir)
    return retriever, tokenizer
