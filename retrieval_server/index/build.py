"""Build an index: ``python -m retrieval_server.build_index --corpus C.jsonl --out DIR --retriever dense``.

Writes ``DIR/faiss.index`` (dense) or ``DIR/bm25/`` (BM25), then ``DIR/manifest.json`` (model, dims,
count, corpus checksum). Choices:
- Two streaming passes over the corpus: the first counts passages and computes the checksum (cheap),
  the second encodes or tokenises them in batches behind a progress bar.
- The build writes into a staging directory beside ``DIR`` and moves its files in only when it has finished
  (``staging.py``, the manifest last): a build that fails leaves an index already in ``DIR`` as it was.
- ``--from-flat DIR`` builds another kind from the vectors of an existing flat index over the same corpus,
  so switching index type does not re-encode the corpus.
- Every approximate build measures its recall@3 and @10 against exact search on held-out queries in the same
  pass and records it in the manifest with the search parameters it was measured at (flat records 1.0: exact by
  definition; BM25 nothing); ``--target-recall`` tunes the search parameter first, ``--nprobe`` / ``--ef-search``
  / ``--k-factor`` set it by hand, ``--index auto`` picks the kind (``tuning.py`` says how). The default held-out
  queries of a build that encodes are corpus passages, read and encoded before the build's pass.
- ``--shards N`` (dense) writes N row-range shards ``DIR/shard-i`` instead of one index, from the same
  encoding pass (``shards.py``).
- FAISS (an optional dependency) is imported only for a dense build: a BM25 build runs without it, and a dense build
  without it stops at once with exit status 2 naming the package to install (``kinds.require_faiss``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from retrieval_server.index.corpus import CorpusError, CorpusScan, iter_passages, scan_corpus
from retrieval_server.index.encoder import DEFAULT_MODEL, E5_PASSAGE_PREFIX, E5_QUERY_PREFIX, Encoder, EncoderError
from retrieval_server.index.kinds import INDEX_KINDS, REFINES, FaissMissing, require_faiss
from retrieval_server.index.manifest import INDEX_FILE, RETRIEVERS, Manifest, ManifestError
from retrieval_server.index.staging import staged
from retrieval_server.index.tuning import (
    DEFAULT_QUERIES,
    RECALL_KS,
    TuningError,
    choose_index,
    exact_topk,
    record_recall,
    sample_rows,
)
from retrieval_server.logs import configure_logging

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


@dataclass(frozen=True)
class IndexChoice:
    """Which dense index to build and how its recall is measured and tuned (``--index`` and friends)."""

    kind: str = "flat"  # kinds.INDEX_KINDS or "auto"
    refine: str = "none"  # kinds.REFINES
    target_recall: float | None = None  # tune the search parameter to reach it (required for auto)
    recall_k: int = 3  # the k of the target recall
    memory_budget_gb: float | None = None  # auto: GiB the index may keep in memory (a refine store counts as disk)
    tune_queries: str | None = None  # file of held-out questions; None = sampled passages
    nprobe: int | None = None  # IVF kinds: lists searched, set by hand instead of tuned (None: default or tuned)
    ef_search: int | None = None  # hnsw: candidates kept while walking the graph, set by hand
    k_factor: int | None = None  # refined kinds: candidates re-ranked per result wanted, set by hand

    def __post_init__(self) -> None:
        if self.search and (self.target_recall is not None or self.kind == "auto"):
            raise ValueError(f"search parameters set by hand ({', '.join(self.search)}) and a tuned or auto index "
                             "(--target-recall, --index auto) exclude each other: give one")

    @property
    def search(self) -> dict:
        """The search parameters set by hand, under their manifest names (``kinds.SEARCH_PARAMS``)."""
        given = {"nprobe": self.nprobe, "efSearch": self.ef_search, "k_factor": self.k_factor}
        return {name: value for name, value in given.items() if value is not None}


def load_tune_queries(path: str | Path) -> list[str]:
    """Questions of ``--tune-queries``: a parquet file's ``question`` column, or JSONL lines with a ``question``,
    ``query`` or ``contents`` field."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"--tune-queries {path} not found")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        if "question" not in table.column_names:
            raise ManifestError(f"--tune-queries {path} has no 'question' column (columns: {table.column_names})")
        return [str(q) for q in table.column("question").to_pylist()][:DEFAULT_QUERIES]
    questions = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        text = next((row[key] for key in ("question", "query", "contents") if isinstance(row.get(key), str)), None)
        if text is None:
            raise ManifestError(f"--tune-queries {path}:{n} has no 'question', 'query' or 'contents' string")
        questions.append(text)
    if not questions:
        raise ManifestError(f"--tune-queries {path} holds no questions")
    return questions[:DEFAULT_QUERIES]


def _held_out(choice: IndexChoice, scan: CorpusScan, encoder: Encoder | None, from_flat: Path | None,
              source: Manifest | None) -> tuple[np.ndarray, str]:
    """Held-out query vectors ``[q, dim]`` and a description of where they come from (tuning.py says why)."""
    if choice.tune_queries:
        if encoder is None:  # --from-flat: the encoder the flat index was built with
            encoder = load_encoder(source.model, source.query_prefix, source.passage_prefix)
        return encoder.encode_queries(load_tune_queries(choice.tune_queries)), f"questions of {choice.tune_queries}"
    rows = sample_rows(scan.count)
    if from_flat is not None:
        from retrieval_server.index.dense import read_index

        flat = read_index(source.index_path(from_flat))
        return np.stack([flat.reconstruct(int(r)) for r in rows]), f"{len(rows)} stored passages (seeded sample)"
    wanted, texts = set(rows.tolist()), []
    for row, text in enumerate(iter_passages(scan.path)):
        if row in wanted:
            texts.append(text)
    return encoder.encode_queries(texts), f"{len(rows)} corpus passages encoded as queries (seeded sample)"


def _build_dense(scan: CorpusScan, out: Path, model: str, choice: IndexChoice, e5_prefixes: bool, batch_size: int,
                 from_flat: Path | None, progress: bool, shards: int = 1) -> Manifest | list[Manifest]:
    import faiss  # here, with the dense machinery, not at the top: a BM25 build runs without FAISS

    from retrieval_server.index.dense import build_dense_index, build_measured_index, flat_batches
    from retrieval_server.index.shards import write_dense_shards

    source, encoder = None, None
    if from_flat is not None:
        source = Manifest.load(from_flat)
        if source.retriever != "dense" or source.index != "flat":
            raise ManifestError(f"--from-flat {from_flat} is not a dense flat index")
        if source.corpus_sha256 != scan.sha256:
            raise ManifestError(f"corpus mismatch: --from-flat {from_flat} was built from another corpus "
                                f"than {scan.path}")
        model, dim, probe = source.model, source.dim, source.probe
        prefixes = (source.query_prefix, source.passage_prefix)

        def batches() -> Iterable[np.ndarray]:
            return flat_batches(source.index_path(from_flat))
        desc = f"copy vectors from {from_flat}"
    elif choice.kind == "auto":
        raise ManifestError("--index auto builds and compares several kinds from the same vectors: build a flat "
                            "index first (--index flat --out FLAT_DIR), then --index auto --from-flat FLAT_DIR")
    else:
        prefixes = (E5_QUERY_PREFIX, E5_PASSAGE_PREFIX) if e5_prefixes else ("", "")
        encoder = load_encoder(model, *prefixes, batch_size=batch_size)
        dim, probe = encoder.dim, [round(x, 6) for x in encoder.fingerprint().tolist()]

        def batches() -> Iterable[np.ndarray]:
            return (encoder.encode_passages(texts) for texts in _batched(iter_passages(scan.path), batch_size))
        desc = "encode"
    if shards > 1 and choice.search:
        raise ManifestError(f"--shards builds each shard at the kind's default search parameters, not at "
                            f"{choice.search}")
    if shards > 1:
        if choice.kind == "auto" or choice.target_recall is not None:
            raise ManifestError("--shards builds each shard at the kind's default search parameters; tune and pick "
                                "the kind on an unsharded build first (--index auto / --target-recall), then shard")
        base = Manifest(retriever="dense", count=scan.count, corpus_sha256=scan.sha256, corpus_bytes=scan.n_bytes,
                        corpus_path=str(scan.path), model=model, dim=dim, index=choice.kind, query_prefix=prefixes[0],
                        passage_prefix=prefixes[1], probe=probe)

        def build_shard(rows: Iterable[np.ndarray], count: int) -> tuple[faiss.Index, dict]:
            index, params = build_dense_index(rows, choice.kind, dim, count, choice.refine)
            if choice.kind == "flat":  # approximate shards claim no recall: it was measured on no shard
                params["recall"] = {"at_3": 1.0, "at_10": 1.0, "queries": 0, "source": "exact search", "params": {}}
            return index, params
        return write_dense_shards(_with_progress(batches(), scan.count, desc, progress), base, out, shards,
                                  build_shard)
    if choice.kind == "auto":
        queries, query_source = _held_out(choice, scan, encoder, from_flat, source)
        truth = exact_topk(_with_progress(batches(), scan.count, "exact top-k of held-out queries", progress),
                           queries, max(RECALL_KS))[1]  # [q, 10]

        def build(kind: str, refine: str) -> tuple[faiss.Index, dict]:
            return build_dense_index(_with_progress(batches(), scan.count, f"build {kind}", progress), kind, dim,
                                     scan.count, refine)
        index, params, report = choose_index(build, scan.count, dim, choice.memory_budget_gb, queries, truth,
                                             choice.target_recall, choice.recall_k)
        kind = params.pop("kind")
        params = record_recall(index, params, queries, truth, query_source)
        params["auto"] = {"target_recall": choice.target_recall, "recall_k": choice.recall_k,
                          "memory_budget_gb": choice.memory_budget_gb, "candidates": report}
    else:
        kind = choice.kind
        queries, query_source = (None, "") if kind == "flat" else _held_out(choice, scan, encoder, from_flat, source)
        index, params = build_measured_index(_with_progress(batches(), scan.count, desc, progress), kind, dim,
                                             scan.count, queries, query_source, choice.refine, choice.target_recall,
                                             choice.recall_k, choice.search)
    tmp = out / (INDEX_FILE + ".tmp")  # renamed over the old file: a server still mapping that one is unaffected
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out / INDEX_FILE)
    return Manifest(retriever="dense", count=scan.count, corpus_sha256=scan.sha256, corpus_bytes=scan.n_bytes,
                    corpus_path=str(scan.path), model=model, dim=dim, index=kind, query_prefix=prefixes[0],
                    passage_prefix=prefixes[1], probe=probe, index_params=params)


def build_index(corpus: str | Path, out: str | Path, retriever: str = "dense", model: str = DEFAULT_MODEL,
                index: str | IndexChoice = "flat", e5_prefixes: bool = False, batch_size: int = 256,
                from_flat: str | Path | None = None, progress: bool = True,
                shards: int = 1) -> Manifest | list[Manifest]:
    """Build the index of ``corpus`` into ``out`` and return its manifest (also written to ``out``); with ``shards``
    > 1, build ``out/shard-0 ...`` instead and return their manifests (``shards.py``; dense only). ``index``: a
    kind (``kinds.INDEX_KINDS``) or an ``IndexChoice`` (refine, target recall, auto)."""
    choice = index if isinstance(index, IndexChoice) else IndexChoice(kind=index)
    if retriever not in RETRIEVERS:
        raise ValueError(f"retriever must be one of {RETRIEVERS}, got {retriever!r}")
    if shards > 1 and retriever != "dense":
        raise ValueError("--shards needs --retriever dense: BM25 scores use corpus-wide statistics, so BM25 shards "
                         "would not rank as the whole index does")
    if retriever == "dense":
        require_faiss()  # before the corpus is scanned and --out created
    out = Path(out)
    scan = scan_corpus(corpus)
    if scan.count == 0:
        raise CorpusError(f"corpus {corpus} has no passages")
    logger.info("corpus %s: %d passages, sha256 %s", corpus, scan.count, scan.sha256[:12])
    if not 1 <= shards <= scan.count:
        raise CorpusError(f"--shards {shards}: give 1 to the corpus's {scan.count} passages")
    make_out_dir(out)
    with staged(out) as stage:  # nothing reaches `out` unless the whole build succeeds
        if retriever == "bm25":
            from retrieval_server.index.bm25 import build_bm25_index  # bm25s, numba, SciPy: BM25 builds only

            params = build_bm25_index(iter_passages(scan.path), scan.count, stage, progress)
            manifest = Manifest(retriever="bm25", count=scan.count, corpus_sha256=scan.sha256,
                                corpus_bytes=scan.n_bytes, corpus_path=str(scan.path), index_params=params)
        else:
            manifest = _build_dense(scan, stage, model, choice, e5_prefixes, batch_size,
                                    Path(from_flat) if from_flat else None, progress, shards)
        if shards == 1:
            manifest.save(stage)
    if shards > 1:
        logger.info("wrote %d shards of the %s index of %d passages to %s/shard-*", shards, choice.kind, scan.count,
                    out)
        return manifest
    logger.info("wrote %s index of %d passages to %s", retriever, scan.count, out)
    return manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m retrieval_server.build_index", description=__doc__.split("\n")[0])
    p.add_argument("--corpus", required=True, help='JSONL corpus, one {"id": str, "contents": str} per line')
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--retriever", choices=RETRIEVERS, default="dense")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="sentence-transformers / HF encoder path (dense; default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--index", choices=(*INDEX_KINDS, "auto"), default="flat",
                   help="FAISS index (dense): flat = exact; fp16 / sq8 = scalar-quantised scan; hnsw, hnswsq8, "
                        "hnswsq6, pcahnswsq8 (graphs; the sq kinds with --refine fp32; pca: over a 2d/3 projection), "
                        "ivf, ivfsq8, ivfpq, opq = approximate; "
                        "auto = the fastest within --memory-budget reaching --target-recall (needs --from-flat "
                        "FLAT_DIR: each candidate is built from that flat index's vectors, one pass each). Sizes and "
                        "parameters: retrieval_server/index/kinds.py")
    p.add_argument("--refine", choices=REFINES, default="none",
                   help="approximate kinds: re-rank the candidates with a stored copy of the vectors in this precision")
    p.add_argument("--target-recall", type=float, default=None,
                   help="tune nprobe / efSearch / k_factor to the cheapest setting reaching this recall@--recall-k "
                        "(recall@3 by default) against exact search on held-out queries (required for --index auto)")
    p.add_argument("--recall-k", type=int, default=3, choices=RECALL_KS,
                   help="the k of --target-recall: the share of the exact top-k found by a top-k search (default 3)")
    p.add_argument("--memory-budget", type=float, default=None, metavar="GB",
                   help="--index auto: the chosen index must keep at most this many GiB in memory (codes, ids, "
                        "graph; a refine store is memory-mapped and read a few rows per query, so it counts as disk)")
    p.add_argument("--tune-queries", default=None,
                   help="held-out questions for measuring recall (parquet with a 'question' column, or JSONL with "
                        "'question' / 'query' / 'contents'); default: 1000 sampled corpus passages")
    p.add_argument("--nprobe", type=int, default=None,
                   help="IVF kinds: inverted lists searched per query, set by hand instead of the default or "
                        "--target-recall (recall is measured at it)")
    p.add_argument("--ef-search", type=int, default=None,
                   help="hnsw kinds: candidate list size of a graph search, set by hand (recall is measured at it)")
    p.add_argument("--k-factor", type=int, default=None,
                   help="with --refine: candidates re-ranked per result wanted, set by hand (recall is measured at it)")
    p.add_argument("--e5-prefixes", action="store_true",
                   help="prepend 'query: ' / 'passage: ' (e5-style encoders; recorded in the manifest)")
    p.add_argument("--batch-size", type=int, default=256, help="passages encoded per batch (dense)")
    p.add_argument("--from-flat", default=None,
                   help="take the vectors (and encoder) from this flat index of the same corpus instead of encoding")
    p.add_argument("--shards", type=int, default=1,
                   help="write N row-range shards OUT/shard-0 ... OUT/shard-{N-1}, one server each (dense)")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.target_recall is not None and not 0 < args.target_recall <= 1:
        p.error(f"--target-recall must be in (0, 1], got {args.target_recall}")
    if args.index == "auto" and (args.target_recall is None or args.memory_budget is None):
        p.error("--index auto needs --target-recall R and --memory-budget GB")
    if args.memory_budget is not None and not 0 < args.memory_budget < float("inf"):  # also refuses nan
        p.error(f"--memory-budget must be a positive number of GiB, got {args.memory_budget}")
    if args.refine != "none" and args.index in ("flat", "auto"):
        p.error(f"--refine applies to approximate kinds, not --index {args.index}")
    if args.shards < 1:
        p.error(f"--shards must be at least 1, got {args.shards}")
    by_hand = [flag for flag, value in (("--nprobe", args.nprobe), ("--ef-search", args.ef_search),
                                        ("--k-factor", args.k_factor)) if value is not None]
    if by_hand and (args.target_recall is not None or args.index == "auto"):
        p.error(f"{', '.join(by_hand)} sets the search parameter by hand; --target-recall and --index auto tune it: "
                "give one")
    if args.shards > 1 and args.retriever != "dense":
        p.error("--shards needs --retriever dense (BM25 scores use corpus-wide statistics)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    try:
        choice = IndexChoice(args.index, args.refine, args.target_recall, args.recall_k, args.memory_budget,
                             args.tune_queries, args.nprobe, args.ef_search, args.k_factor)
        build_index(args.corpus, args.out, args.retriever, args.model, choice, args.e5_prefixes,
                    args.batch_size, args.from_flat, shards=args.shards)
    except (CorpusError, ManifestError, EncoderError, TuningError, FaissMissing,
            ValueError) as e:  # ValueError: kinds
        logger.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
