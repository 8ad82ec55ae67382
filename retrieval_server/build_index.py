"""Build an index: ``python -m retrieval_server.build_index --corpus C.jsonl --out DIR --retriever dense``.

Writes ``DIR/faiss.index`` (dense) or ``DIR/bm25/`` (BM25), then ``DIR/manifest.json`` (model, dims,
count, corpus checksum). Choices:
- Two streaming passes over the corpus: the first counts passages and computes the checksum (cheap),
  the second encodes or tokenises them in batches behind a progress bar.
- The manifest is deleted when a build starts and written when it ends, so an interrupted build is
  never served.
- ``--from-flat DIR`` builds an HNSW or IVF index from the vectors of an existing flat index over the
  same corpus, so switching index type does not re-encode the corpus.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from retrieval_server.bm25 import build_bm25_index
from retrieval_server.corpus import CorpusError, CorpusScan, iter_passages, scan_corpus
from retrieval_server.encoder import DEFAULT_MODEL, E5_PASSAGE_PREFIX, E5_QUERY_PREFIX, Encoder, EncoderError
from retrieval_server.logs import configure_logging
from retrieval_server.manifest import INDEX_FILE, MANIFEST_NAME, RETRIEVERS, Manifest, ManifestError

logger = logging.getLogger("retrieval_server.build_index")


def _batched(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    batch = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _with_progress(batches: Iterable[np.ndarray], total: int, desc: str, progress: bool) -> Iterator[np.ndarray]:
    with tqdm(total=total, desc=desc, unit="passage", disable=not progress) as bar:
        for batch in batches:
            yield batch
            bar.update(len(batch))


def load_encoder(model: str, query_prefix: str = "", passage_prefix: str = "", **kwargs) -> Encoder:
    """``Encoder(model, ...)``; a model that does not load (no such directory, damaged files) is an ``EncoderError``
    naming it, which the tools' ``main`` turns into exit status 2."""
    try:
        return Encoder(model, query_prefix, passage_prefix, **kwargs)
    except EncoderError:
        raise
    except Exception as e:  # sentence-transformers, transformers and safetensors raise many types for a bad model
        raise EncoderError(f"encoder --model {model} does not load ({type(e).__name__}: {e}); give a "
                           "sentence-transformers or Hugging Face encoder directory (or Hub id) whose files are "
                           "whole") from None


def make_out_dir(out: Path) -> None:
    """``--out`` is a directory, created with its parents if missing; ``ManifestError`` naming it otherwise."""
    if out.exists() and not out.is_dir():
        raise ManifestError(f"--out {out} is a file; name a directory for the index")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ManifestError(f"--out {out}: cannot create the directory ({e.strerror}: {e.filename})") from None


def _build_dense(scan: CorpusScan, out: Path, model: str, kind: str, e5_prefixes: bool, batch_size: int,
                 from_flat: Path | None, progress: bool) -> Manifest:
    import faiss

    from retrieval_server.dense import build_dense_index, flat_batches

    if from_flat is not None:
        source = Manifest.load(from_flat)
        if source.retriever != "dense" or source.index != "flat":
            raise ManifestError(f"--from-flat {from_flat} is not a dense flat index")
        if source.corpus_sha256 != scan.sha256:
            raise ManifestError(f"corpus mismatch: --from-flat {from_flat} was built from another corpus "
                                f"than {scan.path}")
        model, dim, probe = source.model, source.dim, source.probe
        prefixes = (source.query_prefix, source.passage_prefix)
        batches = flat_batches(source.index_path(from_flat))
        desc = f"copy vectors from {from_flat}"
    else:
        prefixes = (E5_QUERY_PREFIX, E5_PASSAGE_PREFIX) if e5_prefixes else ("", "")
        encoder = load_encoder(model, *prefixes, batch_size=batch_size)
        dim, probe = encoder.dim, [round(x, 6) for x in encoder.fingerprint().tolist()]
        batches = (encoder.encode_passages(texts) for texts in _batched(iter_passages(scan.path), batch_size))
        desc = "encode"
    index, params = build_dense_index(_with_progress(batches, scan.count, desc, progress), kind, dim, scan.count)
    tmp = out / (INDEX_FILE + ".tmp")  # renamed over the old file: a server still mapping that one is unaffected
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out / INDEX_FILE)
    return Manifest(retriever="dense", count=scan.count, corpus_sha256=scan.sha256, corpus_bytes=scan.n_bytes,
                    corpus_path=str(scan.path), model=model, dim=dim, index=kind, query_prefix=prefixes[0],
                    passage_prefix=prefixes[1], probe=probe, index_params=params)


def build_index(corpus: str | Path, out: str | Path, retriever: str = "dense", model: str = DEFAULT_MODEL,
                index: str = "flat", e5_prefixes: bool = False, batch_size: int = 256,
                from_flat: str | Path | None = None, progress: bool = True) -> Manifest:
    """Build the index of ``corpus`` into ``out`` and return its manifest (also written to ``out``)."""
    if retriever not in RETRIEVERS:
        raise ValueError(f"retriever must be one of {RETRIEVERS}, got {retriever!r}")
    out = Path(out)
    scan = scan_corpus(corpus)
    if scan.count == 0:
        raise CorpusError(f"corpus {corpus} has no passages")
    logger.info("corpus %s: %d passages, sha256 %s", corpus, scan.count, scan.sha256[:12])
    make_out_dir(out)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    if retriever == "bm25":
        params = build_bm25_index(iter_passages(scan.path), scan.count, out, progress)
        manifest = Manifest(retriever="bm25", count=scan.count, corpus_sha256=scan.sha256,
                            corpus_bytes=scan.n_bytes, corpus_path=str(scan.path), index_params=params)
    else:
        manifest = _build_dense(scan, out, model, index, e5_prefixes, batch_size,
                                Path(from_flat) if from_flat else None, progress)
    manifest.save(out)
    logger.info("wrote %s index of %d passages to %s", retriever, scan.count, out)
    return manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m retrieval_server.build_index", description=__doc__.split("\n")[0])
    p.add_argument("--corpus", required=True, help='JSONL corpus, one {"id": str, "contents": str} per line')
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--retriever", choices=RETRIEVERS, default="dense")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="sentence-transformers / HF encoder path (dense; default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--index", choices=("flat", "hnsw", "ivf"), default="flat",
                   help="FAISS index: flat = exact, hnsw / ivf = approximate (dense)")
    p.add_argument("--e5-prefixes", action="store_true",
                   help="prepend 'query: ' / 'passage: ' (e5-style encoders; recorded in the manifest)")
    p.add_argument("--batch-size", type=int, default=256, help="passages encoded per batch (dense)")
    p.add_argument("--from-flat", default=None,
                   help="take the vectors (and encoder) from this flat index of the same corpus instead of encoding")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch-size must be at least 1, got {args.batch_size}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    try:
        build_index(args.corpus, args.out, args.retriever, args.model, args.index, args.e5_prefixes,
                    args.batch_size, args.from_flat)
    except (CorpusError, ManifestError, EncoderError) as e:
        logger.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
