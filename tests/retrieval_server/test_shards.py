"""Row-range shards: built, imported and served, searched through the client as one index.

Real FAISS, real servers on loopback (``shard_sets``, tests/retrieval_servers.py: shared with
tests/test_user_errors_surfaces.py), the small test corpus. The reference is the unsharded flat index of the same
corpus, loaded in this process.
"""

from __future__ import annotations

import json

import faiss
import httpx
import numpy as np
import pytest

from retrieval_server.index.build import build_index
from retrieval_server.index.import_faiss import import_index
from retrieval_server.index.manifest import Manifest, ManifestError
from retrieval_server.index.shards import shard_ranges, split_rows
from retrieval_server.search.service import ServeOptions, load_service, probe_hash
from search_r1.search import RetrievalClient, RetrievalError
from search_r1.search.endpoints import EndpointSetError, Served, group_replicas, merge_hits
from tests.retrieval_server.retrieval_test_corpus import PASSAGES, corpus_lines

pytestmark = pytest.mark.slow  # starts servers

QUERIES = [title for _, title, _ in PASSAGES] + [
    "river flowing into the sea", "glassmaker guild apprentices", "astronomer who mapped comets", "cheese fair",
    "a town with a ruined lighthouse", "stone bridge engineer", "novels about lost sailors", "brass telescope",
    "flood", "wool market", "southern marshes", "mountain", "capital city", "born in 1692", "two centuries",
    "nine bridges", "autumn", "harbour", "observatory", "estmark",
]


def test_shard_ranges_are_contiguous_and_as_equal_as_possible():
    """Guards against a row lost or served twice at a shard boundary, and against lopsided shards."""
    for count in (1, 7, 20, 101):
        for n in range(1, min(count, 9) + 1):
            ranges = shard_ranges(count, n)
            rows = [row for start, end in ranges for row in range(start, end)]
            assert rows == list(range(count))
            sizes = [end - start for start, end in ranges]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    vectors = np.arange(23 * 2, dtype=np.float32).reshape(23, 2)  # [23, 2]
    batches = [vectors[i:i + 5] for i in range(0, 23, 5)]  # batch edges fall inside shards
    parts = [np.concatenate(list(rows)) for rows in split_rows(batches, shard_ranges(23, 3))]
    assert [len(p) for p in parts] == [8, 8, 7] and np.array_equal(np.concatenate(parts), vectors)


@pytest.fixture(scope="module")
def reference(flat_index, corpus_path):
    """The unsharded flat index, served in this process."""
    service = load_service(flat_index, corpus_path, ServeOptions(threads=1))
    yield service
    service.close()


def _raw(url: str, queries: list[str], k: int) -> list[list[dict]]:
    body = {"queries": queries, "topk": k, "return_scores": True, "return_rows": True}
    return httpx.post(url + "/retrieve", json=body, timeout=30).json()["result"]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("topk", [3, 10])
def test_sharded_search_equals_the_unsharded_flat_index(reference, shard_sets, n, topk):
    """Guards against shards losing or reordering hits: per query the merged top-k of N shards is the whole flat
    index's (ids and order), with the same scores for the same rows; and against a shard server returning its local
    row ids (passages of the wrong shard rows)."""
    name = {2: "two", 3: "three"}[n]
    urls = [shard_sets[name, i] for i in range(n)]
    with RetrievalClient(",".join(reversed(urls)), topk=topk, max_batch=8) as client:  # any order of URLs
        client.check_health()
        got = client.search(QUERIES)
    want = [[json.loads(doc) for doc, _, _ in hits] for hits in reference.search(QUERIES, topk)]
    assert got == want
    # scores: each shard server scores a row as the whole index does
    want_scores = {(q, row): score for q, hits in enumerate(reference.search(QUERIES[:8], topk))
                   for _, score, row in hits}
    shard_hits = {(q, hit["row"]): hit for url in urls for q, hits in enumerate(_raw(url, QUERIES[:8], topk))
                  for hit in hits}
    for key, score in want_scores.items():
        assert shard_hits[key]["score"] == pytest.approx(score, abs=1e-5)
        assert shard_hits[key]["document"]["id"] == PASSAGES[key[1]][0]


def test_tied_scores_come_in_row_order_sharded_or_not(corpus_path, tmp_path):
    """Guards against duplicate passages (exactly tied scores) coming in another order from N shards than from the
    whole index. FAISS's IndexFlatIP returns exact ties in descending row order (FAISS 1.15); the service orders
    them by ascending row, as the client's merge does."""
    lines = corpus_lines()
    copy = json.loads(lines[9])
    for at in (2, 12, 17):  # duplicates of row 9 in every shard of 3
        lines.insert(at, json.dumps({**copy, "id": f"copy-{at}"}))
    corpus = tmp_path / "dups.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    build_index(corpus, tmp_path / "flat", progress=False)
    build_index(corpus, tmp_path / "sharded", shards=3, progress=False)
    options = ServeOptions(threads=1, cache_size=0)
    whole = load_service(tmp_path / "flat", corpus, options)
    shards = [load_service(tmp_path / "sharded" / f"shard-{i}", corpus, options) for i in range(3)]
    query = [copy["contents"]]
    hits = whole.search(query, 6)[0]
    tied_rows = [i for i, line in enumerate(lines) if json.loads(line)["contents"] == copy["contents"]]
    assert [row for _, _, row in hits[:4]] == tied_rows  # ascending
    per_shard = [[[{"document": json.loads(doc), "score": s, "row": r} for doc, s, r in h] for h in shard.search(
        query, 6)] for shard in shards]
    assert merge_hits(per_shard, 6) == [[json.loads(doc) for doc, _, _ in hits]]
    for service in (whole, *shards):
        service.close()


def test_import_splits_a_flat_index_into_the_same_shards(flat_index, corpus_path, tmp_path):
    """Guards against ``import_index --shards`` writing other rows than ``build_index --shards`` (the vectors of rows
    [start, end) of the imported index), and against a shard manifest that loses the corpus it belongs to."""
    manifests = import_index(Manifest.load(flat_index).index_path(flat_index), corpus_path, tmp_path / "imported",
                             sample=4, shards=3, progress=False)
    whole = faiss.read_index(str(Manifest.load(flat_index).index_path(flat_index)))
    assert [m.shard["start"] for m in manifests] == [0, 7, 14] and len({m.shard["set"] for m in manifests}) == 1
    for i, m in enumerate(manifests):
        loaded = Manifest.load(tmp_path / "imported" / f"shard-{i}")
        assert loaded.index_params == m.index_params and loaded.count == m.shard["end"] - m.shard["start"]
        assert loaded.index_file is None and loaded.corpus_count == 20
        part = faiss.read_index(str(loaded.index_path(tmp_path / "imported" / f"shard-{i}")))
        assert np.array_equal(part.reconstruct_n(0, part.ntotal), whole.reconstruct_n(m.shard["start"], m.count))
    with pytest.raises(ManifestError, match="holds the shards of an index: serve each"):
        Manifest.load(tmp_path / "imported")


@pytest.mark.parametrize("case, urls, message", [
    ("different N", [("two", 0), ("three", 1), ("three", 2)], r"different shard sets: .* \(one of 2 shards\); .* "
                                                               r"\(one of 3 shards\)"),
    ("missing shard", [("three", 0), ("three", 2)], r"missing shard 1 of 3: .*shard 0 at .*shard 2 at "),
    ("other corpus", [("two", 0), ("other", 1)], r"different corpus: .* serve corpus sha256 .*; .* serve corpus"),
])
def test_a_mismatched_set_is_refused_naming_the_mismatch(shard_sets, case, urls, message):
    """Guards against merging shards that are not one index (another corpus, encoder or build, a shard missing):
    the answers would look fine and be wrong."""
    named = [shard_sets[key] for key in urls]
    with RetrievalClient(",".join(named), topk=3) as client:
        with pytest.raises(RetrievalError, match=message) as err:
            client.check_health()
    assert all(url in str(err.value) for url in named[1:]), case


def test_shards_of_another_encoder_are_refused(shard_sets, corpus_path, tmp_path):
    """Guards against merging scores of two encoders. (One server less: the second shard's /health is the real one
    with the encoder fingerprint hash of a real build with e5 prefixes.)"""
    e5 = build_index(corpus_path, tmp_path / "e5", shards=2, e5_prefixes=True, progress=False)[1]
    urls = [shard_sets["two", 0], shard_sets["two", 1]]
    health = [httpx.get(url + "/health").json() for url in urls]
    assert health[1]["probe_sha256"] != probe_hash(e5.probe)
    health[1]["probe_sha256"] = probe_hash(e5.probe)
    with pytest.raises(EndpointSetError, match=rf"different encoder: {urls[0]} serve dense model .* \(encoder "
                                               rf"fingerprint {health[0]['probe_sha256']}\); {urls[1]} serve"):
        group_replicas([Served.from_health(url, h) for url, h in zip(urls, health, strict=True)])


def test_one_url_of_a_shard_is_refused(shard_sets):
    """Guards against a run searching one shard of an index as if it were the whole index."""
    with RetrievalClient(shard_sets["three", 1], topk=3) as client:
        with pytest.raises(RetrievalError, match=r"serves only shard 1 of 3 \(rows 7..13, .*give the URLs of all"):
            client.check_health()
