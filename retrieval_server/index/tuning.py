"""Recall of approximate indexes against exact search, measured at build time; search-parameter tuning; ``auto``.

Choices:
- **Ground truth in the build's one pass.** ``StreamingTopK`` keeps the exact top-k of the held-out queries while
  the vectors stream through the build (per batch: ``queries @ batch.T``, merged with the running top-k; ties
  by row id), so measuring recall needs no second pass and no fp32 copy of the corpus in memory.
- **Recall@k** is the share of the exact top-k row ids that the index's top-k (a search for k results, as a
  client asking for top-k makes) contains, averaged over queries.
- **Held-out queries**: ``--tune-queries FILE`` (questions, encoded by the query encoder), else a seeded sample
  of ``DEFAULT_QUERIES`` stored passages, their vectors used as queries. Those are in the index (each finds
  itself first), so the figure is for passage-like queries; the manifest records which source it was.
- **Tuning** (``--target-recall R``): the search parameter of the kind (``nprobe``; ``efSearch``; and for a
  refined index also ``k_factor``) is raised along a ladder (doubling; efSearch in 1.5x steps) until
  recall@``recall_k`` on the held-out queries reaches R; for a refined index every ``k_factor`` of its ladder
  gets its smallest ``nprobe`` (or ``efSearch``) and the pair that searches the held-out queries fastest wins,
  except that a larger ``k_factor`` must be ``KFACTOR_GAIN`` (1.25x) faster than a smaller one to be kept: its extra
  candidates are rows read from a memory-mapped refine store, disk reads when it is not cached, which the
  in-memory timing does not count (measured at 2M vectors: docs/results.md, "Retrieval at scale").
  A kind whose ladder ends below R is reported with the best recall it reached (``TuningError``). ``--nprobe`` /
  ``--ef-search`` / ``--k-factor`` set the parameter by hand instead (recall is then measured at that setting).
- **What is recorded**: every approximate build stores ``index_params["recall"] = {"at_3", "at_10", "queries",
  "source", "params"}``, ``params`` being the search parameters it was measured at. A service whose search
  parameters differ reports ``recall: null`` (``served_recall``): no figure is claimed that was not measured.
  Flat is exact by definition (recall 1.0, not measured).
- **auto** (``choose_index``): the candidates of ``AUTO_CANDIDATES`` whose ``bytes_per_vector`` times the rows fit
  ``--memory-budget`` are built from the same vectors (a flat index's, ``--from-flat``), tuned to the target,
  timed on the held-out queries (top-``recall_k`` searches in batches of ``TIME_BATCH``); the fastest that reaches
  the target is kept.
- Python API (benchmarks): ``dense.build_measured_index`` builds a kind from streamed batches or one array and
  records its recall; ``exact_topk`` and ``measure_recall`` measure any index against exact search.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from retrieval_server.index.kinds import (
    HNSW_KINDS,
    apply_search_params,
    bytes_per_vector,
    resident_bytes_per_vector,
    search_params,
)

if TYPE_CHECKING:  # faiss only in annotations: build_index imports this module for a BM25 build, without FAISS
    import faiss

logger = logging.getLogger(__name__)

DEFAULT_QUERIES = 1000
RECALL_KS = (3, 10)
NPROBE_LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
# efSearch in steps of 1.5x, not 2x: a graph search costs about ef, so a doubling ladder can overshoot the cheapest
# setting by up to 2x in time (at 2M vectors, hnswsq8's 0.99 lay between 256 and 512); a recall measurement is cheap.
EF_LADDER = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
K_FACTOR_LADDER = (1, 2, 4, 8, 16, 32, 64)
KFACTOR_GAIN = 1.25  # a larger k_factor is kept only if it searches this many times faster (tune_search_params)
TIME_BATCH = 512
# (kind, refine) tried by ``auto``, in the order they are built: IVF kinds first (a search scans nprobe of nlist
# lists, the cheapest at millions of rows), smallest codes first; then the exhaustive scans of compressed codes,
# the graphs (pcahnswsq8 + fp32 refine was the fastest at recall@3 0.99 on 2M vectors, and the smallest of those
# reaching it, then hnswsq8 + fp32: docs/results.md), and flat
# last (exact: reaches any target if it fits the budget). Every candidate that fits is built and timed, so the order
# decides only which are built first, not which wins. The budget is resident memory (kinds.
# resident_bytes_per_vector): a refine store is memory-mapped and read k x k_factor rows a query, so it counts as
# disk (each report row gives both); everything a search scans or walks counts in full.
AUTO_CANDIDATES = (("ivfpq", "sq8"), ("ivfsq8", "none"), ("opq", "sq8"), ("ivfpq", "fp16"), ("sq8", "none"),
                   ("ivf", "none"), ("pcahnswsq8", "fp32"), ("hnswsq8", "fp32"), ("hnsw", "none"), ("fp16", "none"),
                   ("flat", "none"))


class TuningError(ValueError):
    """No setting (or no candidate) reaches the target recall within the memory budget; the message says the best."""


class StreamingTopK:
    """Exact inner-product top-k of ``queries`` ``[q, dim]`` over vectors added batch by batch in row order."""

    def __init__(self, queries: np.ndarray, k: int):
        self.queries = np.ascontiguousarray(queries, dtype=np.float32)
        self.k = k
        self.scores = np.full((len(queries), 0), -np.inf, np.float32)  # [q, <=k], best first
        self.ids = np.zeros((len(queries), 0), np.int64)
        self.rows = 0

    def add(self, batch: np.ndarray) -> None:
        scores = self.queries @ np.asarray(batch, np.float32).T  # [q, b]
        ids = np.broadcast_to(np.arange(self.rows, self.rows + batch.shape[0]), scores.shape)
        self.rows += batch.shape[0]
        scores, ids = np.concatenate([self.scores, scores], 1), np.concatenate([self.ids, ids], 1)
        keep = min(self.k, scores.shape[1])
        if scores.shape[1] > keep:
            part = np.argpartition(-scores, keep - 1, axis=1)[:, :keep]  # best k, ties at the boundary arbitrary
            kth = np.take_along_axis(scores, part, 1).min(axis=1)  # [q]
            tied = np.nonzero((scores >= kth[:, None]).sum(axis=1) > keep)[0]
            for r in tied:  # rows with a tie at the k-th score: the lower row ids win, as in the shard merge
                candidates = np.nonzero(scores[r] >= kth[r])[0]
                part[r] = candidates[np.lexsort((ids[r, candidates], -scores[r, candidates]))[:keep]]
        else:
            part = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
        s, i = np.take_along_axis(scores, part, 1), np.take_along_axis(ids, part, 1)
        order = np.lexsort((i, -s), axis=1)  # best first, ties in row order
        self.scores, self.ids = np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """Scores ``[q, k]`` (descending) and row ids ``[q, k]``."""
        return self.scores, self.ids


def stream_truth(batches: Iterable[np.ndarray], top: StreamingTopK) -> Iterator[np.ndarray]:
    """Pass ``batches`` through unchanged, feeding each to ``top`` on the way."""
    for batch in batches:
        top.add(batch)
        yield batch


def exact_topk(batches: Iterable[np.ndarray], queries: np.ndarray, k: int = max(RECALL_KS)
               ) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k of ``queries`` ``[q, dim]`` over ``batches`` (``[n, dim]``, in row order) in one
    pass: scores ``[q, k]`` (descending) and row ids ``[q, k]`` (ties in row order)."""
    top = StreamingTopK(queries, k)
    for batch in batches:
        top.add(batch)
    return top.result()


def exact_recall() -> dict:
    """The ``recall`` record of an exact (flat) index: 1.0 by definition, not measured."""
    return {"at_3": 1.0, "at_10": 1.0, "queries": 0, "source": "exact search", "params": {}}


def sample_rows(count: int, n: int = DEFAULT_QUERIES, seed: int = 0) -> np.ndarray:
    """The default held-out queries' rows: ``min(n, count)`` distinct rows of ``count``, seeded, ascending."""
    return np.sort(np.random.default_rng(seed).choice(count, size=min(n, count), replace=False))


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found ∩ truth| / k, for row ids ``found`` and ``truth`` ``[q, k]``."""
    k = truth.shape[1]
    hits = [len(np.intersect1d(f[f >= 0], t)) for f, t in zip(found, truth, strict=True)]
    return float(np.mean(hits) / k)


def measure_recall(index: faiss.Index, queries: np.ndarray, truth: np.ndarray, ks: Iterable[int] = RECALL_KS
                   ) -> dict[str, float]:
    """``{"at_3": .., "at_10": ..}`` of ``index`` (at its current search parameters) against ``truth`` ``[q, >=k]``.
    Each k is its own search for k results, as a client asking for top-k gets them: a refined index re-ranks
    ``k * k_factor`` candidates, so the top 3 of a top-10 search can be better than a top-3 search."""
    recall = {}
    for k in ks:
        _, found = index.search(queries, k)  # [q, k]
        recall[f"at_{k}"] = recall_at(found, truth[:, :k])
    return recall


def _search_seconds(index: faiss.Index, queries: np.ndarray, k: int) -> float:
    """Seconds to search ``queries`` for top-``k`` in batches of ``TIME_BATCH``."""
    start = time.perf_counter()
    for s in range(0, len(queries), TIME_BATCH):
        index.search(queries[s:s + TIME_BATCH], k)
    return time.perf_counter() - start


def tune_search_params(index: faiss.Index, kind: str, params: dict, queries: np.ndarray, truth: np.ndarray,
                       target: float, k: int = 3) -> dict:
    """``params`` with the cheapest search parameters reaching recall@``k`` >= ``target`` (``TuningError``
    naming the best reached otherwise), applied to ``index``."""
    def recall(setting: dict) -> float:
        apply_search_params(index, setting)
        return measure_recall(index, queries, truth, (k,))[f"at_{k}"]

    if kind in ("flat",):
        return dict(params)
    ladders: list[dict] = [{}]
    if "nlist" in params:
        ladders = [{"nprobe": p} for p in NPROBE_LADDER if p <= params["nlist"]]
    elif kind in HNSW_KINDS:
        ladders = [{"efSearch": e} for e in EF_LADDER]
    factors = [{"k_factor": f} for f in K_FACTOR_LADDER] if "k_factor" in params else [{}]
    best, choices = 0.0, []
    for factor in factors:
        for step in ladders:
            setting = {**factor, **step}
            reached = recall(setting)
            best = max(best, reached)
            if reached >= target:
                choices.append(setting)
                break
    if not choices:
        raise TuningError(f"{kind} (refine {params.get('refine', 'none')}) reaches recall@{k} {best:.4f} at most "
                          f"on {len(queries)} held-out queries, below the target {target}")
    # choices go from the smallest k_factor up; a larger one must search clearly faster (KFACTOR_GAIN) to be kept:
    # each extra candidate is one more row read from the refine store, which the service memory-maps, so a disk read
    # once the store is not cached, which this in-memory timing does not see (and on a shared 2-core machine two
    # timings of one setting differ by about 10%)
    chosen_s, chosen = None, None
    for setting in choices:
        apply_search_params(index, setting)
        seconds = _search_seconds(index, queries, k)
        if chosen_s is None or seconds < chosen_s / KFACTOR_GAIN:
            chosen_s, chosen = seconds, setting
    apply_search_params(index, chosen)
    logger.info("%s: %s reaches recall@%d >= %g", kind, chosen, k, target)
    return {**params, **chosen}


def record_recall(index: faiss.Index, params: dict, queries: np.ndarray, truth: np.ndarray, source: str) -> dict:
    """``params`` with ``recall`` measured at its search parameters (which are applied to ``index`` first)."""
    apply_search_params(index, params)
    measured = measure_recall(index, queries, truth)
    return {**params, "recall": {**measured, "queries": int(len(queries)), "source": source,
                                 "params": search_params(params)}}


def served_recall(params: dict) -> dict | None:
    """The recorded recall if the served search parameters are those it was measured at, else None."""
    recall = params.get("recall")
    if not recall or recall.get("params") != search_params(params):
        return None
    return recall


def choose_index(build: Callable[[str, str], tuple[faiss.Index, dict]], count: int, dim: int,
                 memory_budget_gb: float, queries: np.ndarray, truth: np.ndarray, target: float, k: int = 3
                 ) -> tuple[faiss.Index, dict, list[dict]]:
    """``auto``: build (``build(kind, refine)``) and tune each candidate within the budget; return the fastest
    reaching ``target`` (index, params) and one report row per candidate."""
    budget = memory_budget_gb * 2 ** 30
    fits = [(kind, refine) for kind, refine in AUTO_CANDIDATES
            if resident_bytes_per_vector(kind, dim, refine) * count <= budget]
    if not fits:
        smallest = min(resident_bytes_per_vector(kd, dim, rf) for kd, rf in AUTO_CANDIDATES)
        raise TuningError(f"--memory-budget {memory_budget_gb:g} GB holds no candidate: the smallest needs "
                          f"{smallest:.0f} bytes per vector x {count} vectors = {smallest * count / 2 ** 30:.2f} GB")
    report, winners = [], []
    for kind, refine in fits:
        index, params = build(kind, refine)
        resident = resident_bytes_per_vector(kind, dim, refine)
        row = {"kind": kind, "refine": refine, "gb": resident * count / 2 ** 30,
               "disk_gb": (bytes_per_vector(kind, dim, refine) - resident) * count / 2 ** 30}
        try:
            params = tune_search_params(index, kind, params, queries, truth, target, k)
        except TuningError as e:
            row["error"] = str(e)
            report.append(row)
            logger.info("auto: %s", e)
            continue
        row.update(params=search_params(params), seconds=_search_seconds(index, queries, k))
        report.append(row)
        winners.append((row["seconds"], kind, refine, index, params))
        logger.info("auto: %s refine %s reaches the target; %.3f s for %d queries", kind, refine, row["seconds"],
                    len(queries))
    if not winners:
        raise TuningError(f"no index kind within --memory-budget {memory_budget_gb:g} GB reaches recall@{k} "
                          f"{target}: " + "; ".join(r["error"] for r in report))
    _, kind, refine, index, params = min(winners, key=lambda w: w[0])
    return index, {**params, "kind": kind}, report
