"""Serve a FAISS index built elsewhere, without re-encoding its corpus:

    python -m retrieval_server.import_index --faiss e5_Flat.index --corpus wiki-18.jsonl \\
        --model /path/to/e5-base-v2 --e5-prefixes --out indexes/wiki18_e5

Search-R1 (and FlashRAG) users have the wiki-18 corpus and its e5 flat index, whose row i is the
vector of line i of the corpus. This writes ``OUT/manifest.json`` for it (the FAISS file stays where it
is; the manifest records its path and size), after checking what can be checked, and refuses with a
message naming the mismatch otherwise:

- the index type stores exact vectors (``IndexFlatIP``, ``IndexHNSWFlat``, ``IndexIVFFlat``) and its
  metric is inner product (what the server ranks by: cosine, for unit vectors);
- its vector count equals the corpus's passages (non-blank lines), its dimension the encoder's;
- a sample of passages (``--sample``, seeded, first and last row included), re-encoded with the
  encoder, finds its own row at rank 1 (a row whose passage text is identical counts: duplicated
  passages have equal vectors), for at least ``MIN_RANK1_FRACTION`` of the sample, and the score of
  its own row (the cosine of the re-encoded and the stored vector, for unit vectors) is on average at
  least ``MIN_MEAN_COSINE`` and nowhere above ``MAX_COSINE`` (stored vectors of unit length). This
  catches a corpus in another order, another encoder or unnormalised vectors;
- the sample is also encoded with the other prefix setting: if the stored vectors fit it clearly
  better, the message says to add or drop ``--e5-prefixes``.

``--shards N`` splits a flat index's vectors into N row-range shards ``OUT/shard-i``, each with its own
FAISS file (a copy of its rows) and manifest (``shards.py``), after the same checks.

The check searches the sample over the whole index: for a flat index that is one read of the file
(the vectors are memory-mapped), minutes for a 60 GB index on a cold disk; ``--sample 0`` skips it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval_server.index.build import load_encoder, make_out_dir
from retrieval_server.index.corpus import CorpusError, CorpusScan, CorpusStore, scan_corpus
from retrieval_server.index.encoder import DEFAULT_MODEL, E5_PASSAGE_PREFIX, E5_QUERY_PREFIX, EncoderError
from retrieval_server.index.kinds import FaissMissing, require_faiss
from retrieval_server.index.manifest import Manifest, ManifestError
from retrieval_server.index.staging import staged
from retrieval_server.logs import configure_logging

logger = logging.getLogger("retrieval_server.import_index")

MIN_RANK1_FRACTION = 0.95  # near-duplicate passages may take rank 1 from a passage's own row
MIN_MEAN_COSINE = 0.98  # the same encoder on another device / precision stays above 0.99
MAX_COSINE = 1.01  # above: the stored vectors are not unit length
PREFIX_MARGIN = 0.01  # the other prefix setting must beat this one by this much to be reported
CHECK_K = 10  # results searched per sampled passage
HNSW_CHECK_EF_SEARCH = 256  # the check searches HNSW / IVF (nearly) exhaustively, so misses are not the ANN's


@dataclass(frozen=True)
class SampleCheck:
    """How a sample of re-encoded passages finds its own rows in the index."""

    rows: list[int]
    at_rank1: list[bool]  # own row (or a row with the identical passage) at rank 1
    own_scores: list[float]  # score of the own row in the top CHECK_K, 0 where it is not there

    @property
    def rank1_fraction(self) -> float:
        return float(np.mean(self.at_rank1))

    @property
    def mean_cosine(self) -> float:
        return float(np.mean(self.own_scores))


def sample_rows(count: int, size: int, seed: int = 0) -> list[int]:
    """``size`` distinct rows of ``count`` (all of them if fewer), the first and last always included, the others
    drawn with a seeded generator."""
    if size >= count:
        return list(range(count))
    interior = np.random.default_rng(seed).choice(np.arange(1, count - 1), size=max(0, size - 2), replace=False)
    return sorted({0, count - 1, *interior.tolist()})


def read_contents(scan: CorpusScan, rows: list[int]) -> dict[int, str]:
    """``contents`` of the passages of ``rows``."""
    store = CorpusStore(scan)
    try:
        lines = store.fetch(np.asarray([rows], dtype=np.int64))[0]
    finally:
        store.close()
    return {row: json.loads(line)["contents"] for row, line in zip(rows, lines, strict=True)}


def check_sample(index, encoder, scan: CorpusScan, rows: list[int], prefixes: list[str]) -> list[SampleCheck]:
    """Re-encode the passages of ``rows`` once per prefix in ``prefixes``, search them all in one call (one read
    of a memory-mapped index), and see where each finds its own row."""
    contents = read_contents(scan, rows)
    vectors = np.concatenate([encoder.encode([contents[r] for r in rows], prefix) for prefix in prefixes])  # [P*S, d]
    scores, ids = index.search(vectors, min(CHECK_K, index.ntotal))  # [P*S, k], [P*S, k]
    rows_all = rows * len(prefixes)
    other_top = sorted({int(top) for row, top in zip(rows_all, ids[:, 0].tolist(), strict=True)
                        if top != row and top >= 0} - set(contents))
    contents |= read_contents(scan, other_top) if other_top else {}  # to tell identical passages from misses
    at_rank1, own_scores = [], []
    for row, row_ids, row_scores in zip(rows_all, ids.tolist(), scores.tolist(), strict=True):
        at_rank1.append(row_ids[0] == row or contents.get(row_ids[0]) == contents[row])
        own_scores.append(row_scores[row_ids.index(row)] if row in row_ids else 0.0)
    n = len(rows)
    return [SampleCheck(rows, at_rank1[i * n:(i + 1) * n], own_scores[i * n:(i + 1) * n]) for i in range(len(prefixes))]


def _verify_sample(index, encoder, scan: CorpusScan, passage_prefix: str, sample: int, faiss_file: Path,
                   corpus: Path) -> dict:
    """The sample check (module docstring); returns its figures for the manifest, raises ``ManifestError``."""
    rows = sample_rows(index.ntotal, sample)
    other_prefix = "" if passage_prefix else E5_PASSAGE_PREFIX
    logger.info("re-encoding %d sampled passages and searching them over %d vectors", len(rows), index.ntotal)
    result, other = check_sample(index, encoder, scan, rows, [passage_prefix, other_prefix])
    if other.mean_cosine > result.mean_cosine + PREFIX_MARGIN:
        raise ManifestError(
            f"prefix mismatch: the vectors of {faiss_file} fit the passages encoded "
            f"{'with' if other_prefix else 'without'} the '{E5_PASSAGE_PREFIX}' prefix better (mean cosine "
            f"{other.mean_cosine:.4f} vs {result.mean_cosine:.4f}); {'add' if other_prefix else 'drop'} --e5-prefixes")
    misses = [r for r, ok in zip(rows, result.at_rank1, strict=True) if not ok]
    if result.rank1_fraction < MIN_RANK1_FRACTION or result.mean_cosine < MIN_MEAN_COSINE:
        raise ManifestError(
            f"index mismatch: only {len(rows) - len(misses)} of {len(rows)} sampled passages of {corpus} find their "
            f"own row of {faiss_file} at rank 1 (at least {MIN_RANK1_FRACTION:.0%} needed; mean cosine of re-encoded "
            f"and stored vectors {result.mean_cosine:.4f}, at least {MIN_MEAN_COSINE} needed; rows missed: "
            f"{misses[:10]}). The index must be built from this corpus in this order (row i = passage i) with "
            f"encoder {encoder.name}{' and the e5 prefixes' if passage_prefix else ''}")
    if max(result.own_scores) > MAX_COSINE:
        raise ManifestError(
            f"{faiss_file} holds vectors that are not unit length (inner product of a re-encoded passage with its own "
            f"row up to {max(result.own_scores):.3f}); the server ranks by cosine: normalise the vectors "
            "(faiss.normalize_L2) and write the index again")
    if misses:
        logger.warning("%d sampled rows not found at rank 1 (near-duplicate passages?): %s", len(misses), misses)
    return {"sample": len(rows), "rank1": len(rows) - len(misses), "mean_cosine": round(result.mean_cosine, 5)}


def import_index(faiss_file: str | Path, corpus: str | Path, out: str | Path, model: str = DEFAULT_MODEL,
                 e5_prefixes: bool = False, sample: int = 64, progress: bool = True,
                 shards: int = 1) -> Manifest | list[Manifest]:
    """Check ``faiss_file`` against ``corpus`` and the encoder ``model``; write ``out/manifest.json`` for it. With
    ``shards`` > 1 (a flat index), split its vectors into ``out/shard-0 ...`` instead (``shards.py``) and return
    their manifests."""
    faiss_file, corpus, out = Path(faiss_file).resolve(), Path(corpus), Path(out)
    if not faiss_file.is_file():
        raise ManifestError(f"FAISS index file not found: {faiss_file}")
    require_faiss("importing a FAISS index")
    make_out_dir(out)
    with staged(out) as stage:  # a failed import leaves `out` as it was (staging.py)
        manifests = _import(faiss_file, corpus, stage, model, e5_prefixes, sample, progress, shards)
    if shards > 1:
        logger.info("imported %s as %d shards %s/shard-*", faiss_file, shards, out)
    else:
        logger.info("imported %s (%s, %d vectors) as %s", faiss_file, manifests.index, manifests.count, out)
    return manifests


def _import(faiss_file: Path, corpus: Path, out: Path, model: str, e5_prefixes: bool, sample: int, progress: bool,
            shards: int) -> Manifest | list[Manifest]:
    """``import_index``'s checks and writes, into the staging directory ``out``."""
    import faiss

    from retrieval_server.index.dense import build_dense_index, flat_batches, index_kind, read_index
    from retrieval_server.index.kinds import HNSW_EF_SEARCH
    from retrieval_server.index.shards import write_dense_shards

    try:
        index = read_index(faiss_file)  # memory-mapped: nothing is loaded yet
    except RuntimeError as e:  # FAISS's reader raises RuntimeError for a damaged or foreign file
        raise ManifestError(f"{faiss_file} ({faiss_file.stat().st_size:,} bytes) is not a readable FAISS index: "
                            f"{str(e).splitlines()[0]}; give the index file as faiss.write_index wrote it") from None
    try:
        kind = index_kind(index)
    except ValueError as e:
        raise ManifestError(f"{faiss_file}: {e}") from None
    if kind not in ("flat", "hnsw", "ivf"):  # the sample check compares stored and re-encoded vectors
        raise ManifestError(f"{faiss_file} is a {kind} index, whose vectors are compressed; import stores exact "
                            "vectors only (IndexFlatIP, IndexHNSWFlat, IndexIVFFlat): import the flat index, then "
                            f"`build_index --index {kind} --from-flat DIR`")
    if shards > 1 and kind != "flat":
        raise ManifestError(f"--shards splits a flat index, but {faiss_file} holds a {kind} index; import the flat "
                            "index of the corpus (or build the shards with build_index --shards)")
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ManifestError(f"{faiss_file} ranks by metric {index.metric_type} (1 = L2), not inner product (0); the "
                            "server ranks unit vectors by inner product: build the index with METRIC_INNER_PRODUCT "
                            "(IndexFlatIP)")
    scan = scan_corpus(corpus, progress=progress)
    if scan.count != index.ntotal:
        raise ManifestError(f"count mismatch: {faiss_file} holds {index.ntotal} vectors but {corpus} has {scan.count} "
                            "passages (non-blank lines); row i of the index must be passage i of the corpus")
    if not 1 <= shards <= scan.count:
        raise ManifestError(f"--shards {shards}: give 1 to the corpus's {scan.count} passages")
    prefixes = (E5_QUERY_PREFIX, E5_PASSAGE_PREFIX) if e5_prefixes else ("", "")
    encoder = load_encoder(model, *prefixes)  # fp32: the manifest's fingerprint is an fp32 embedding
    if encoder.dim != index.d:
        raise ManifestError(f"dimension mismatch: {faiss_file} holds vectors of dimension {index.d}, but encoder "
                            f"{model} embeds in dimension {encoder.dim}; give the --model the index was built with")
    params: dict = {"imported_from": str(faiss_file)}
    if kind == "hnsw":
        params["efSearch"] = int(index.hnsw.efSearch) or HNSW_EF_SEARCH
        index.hnsw.efSearch = max(params["efSearch"], HNSW_CHECK_EF_SEARCH)
    elif kind == "ivf":
        params["nprobe"] = int(index.nprobe)
        index.nprobe = index.nlist  # exhaustive for the check
    if sample > 0:
        params["import_check"] = _verify_sample(index, encoder, scan, prefixes[1], sample, faiss_file, corpus)
    else:
        logger.warning("--sample 0: the passages were not checked against the vectors")
    manifest = Manifest(retriever="dense", count=scan.count, corpus_sha256=scan.sha256, corpus_bytes=scan.n_bytes,
                        corpus_path=str(corpus), model=model, dim=encoder.dim, index=kind,
                        query_prefix=prefixes[0], passage_prefix=prefixes[1],
                        probe=[round(x, 6) for x in encoder.fingerprint().tolist()], index_params=params,
                        index_file=str(faiss_file), index_bytes=faiss_file.stat().st_size)
    if shards > 1:  # each shard gets its own FAISS file, copied from the flat index: no index_file
        return write_dense_shards(flat_batches(faiss_file), manifest, out, shards,
                                  lambda rows, n: build_dense_index(rows, "flat", index.d, n))
    manifest.save(out)
    return manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m retrieval_server.import_index",
                                description="Serve a FAISS index built elsewhere (row i = passage i of the corpus).")
    p.add_argument("--faiss", required=True, help="FAISS index file (e.g. Search-R1's e5_Flat.index); not copied")
    p.add_argument("--corpus", required=True, help='its JSONL corpus, one {"id": str, "contents": str} per line')
    p.add_argument("--model", default=DEFAULT_MODEL, help="the sentence-transformers / HF encoder that built it")
    p.add_argument("--e5-prefixes", action="store_true",
                   help="the index was built with 'passage: ' prefixes; queries get 'query: ' (e5 models)")
    p.add_argument("--out", required=True, help="index directory to write (manifest.json only)")
    p.add_argument("--sample", type=int, default=64, help="passages re-encoded to check the index (0: skip)")
    p.add_argument("--shards", type=int, default=1,
                   help="split the (flat) index's vectors into N row-range shards OUT/shard-0 ... OUT/shard-{N-1}, "
                        "one server each (copies the vectors)")
    args = p.parse_args(argv)
    if args.sample < 0:
        p.error(f"--sample must be 0 (skip the check) or more, got {args.sample}")
    if args.shards < 1:
        p.error(f"--shards must be at least 1, got {args.shards}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    try:
        import_index(args.faiss, args.corpus, args.out, args.model, args.e5_prefixes, args.sample, shards=args.shards)
    except (CorpusError, ManifestError, EncoderError, FaissMissing) as e:
        logger.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
