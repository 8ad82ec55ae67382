"""The real service on loopback: result shape, exactness of flat search, BM25, every bad input, health,
concurrency, and refusal of an index that does not match its corpus or encoder."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from retrieval_server.index.encoder import DEFAULT_MODEL, Encoder
from retrieval_server.launcher import ServerProcess
from tests.retrieval_server.retrieval_test_corpus import PASSAGES, RARE_TERM

pytestmark = pytest.mark.slow  # starts retrieval servers: not in `make test-fast`

IDS = [pid for pid, _, _ in PASSAGES]
CONTENTS = [f'"{title}"\n{text}' for _, title, text in PASSAGES]


def _post(server: ServerProcess, payload: object) -> httpx.Response:
    return httpx.post(server.url + "/retrieve", json=payload, timeout=60)


def test_health_answers_loading_then_ok(flat_server):
    """Guards against /health claiming ready before the index is loaded (clients would get 503s or errors).
    (The dense server loads for seconds, importing torch and the encoder, so "loading" is always seen.)"""
    assert flat_server.health_seen == ["loading", "ok"]
    health = httpx.get(flat_server.url + "/health").json()
    assert (health["status"], health["retriever"], health["index"]) == ("ok", "dense", "flat")
    assert health["model"] == DEFAULT_MODEL and health["passages"] == len(PASSAGES)


def test_result_shape_is_search_r1s(bm25_server):
    """Guards against drifting from the Search-R1 response shape that existing clients parse."""
    plain = _post(bm25_server, {"queries": ["Varnel River", "Dunmere comets"], "topk": 4}).json()
    assert list(plain) == ["result"] and len(plain["result"]) == 2
    for docs in plain["result"]:
        assert len(docs) == 4 and all(set(doc) == {"id", "contents"} for doc in docs)
        assert all(CONTENTS[IDS.index(doc["id"])] == doc["contents"] for doc in docs)
    scored = _post(bm25_server, {"queries": ["Varnel River"], "topk": None, "return_scores": True}).json()
    hits = scored["result"][0]
    assert len(hits) == 3  # the server's --topk when the request says null
    assert all(set(hit) == {"document", "score"} and isinstance(hit["score"], float) for hit in hits)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    unscored = _post(bm25_server, {"queries": ["Varnel River"], "topk": 3}).json()["result"][0]
    assert [h["document"] for h in hits] == unscored


def test_flat_search_equals_brute_force_inner_product(flat_server):
    """Guards against the served ids differing from exact search: wrong row -> passage mapping, unnormalised
    vectors, or query/passage prefixes applied differently than at build time."""
    queries = ["Which river flows into the Sallow Sea?", "who made glass in Kelbrook", "cheese aged in caves",
               "a telescope made of brass", "folk songs about ferrymen"]
    encoder = Encoder(DEFAULT_MODEL)
    passages, query_vectors = encoder.encode_passages(CONTENTS), encoder.encode_queries(queries)
    expected = []
    for q in query_vectors:  # plain loop over every passage
        scores = [(float(np.dot(q, p)), IDS[i]) for i, p in enumerate(passages)]
        expected.append([pid for _, pid in sorted(scores, key=lambda s: -s[0])[:5]])
    result = _post(flat_server, {"queries": queries, "topk": 5, "return_scores": True}).json()["result"]
    assert [[hit["document"]["id"] for hit in hits] for hits in result] == expected


def test_bm25_ranks_the_rare_term_passage_first(bm25_server):
    """Guards against BM25 over HTTP losing exact lexical matches (the reason to serve BM25 at all)."""
    result = _post(bm25_server, {"queries": [f"which clock is {RARE_TERM}?"], "topk": 3}).json()["result"]
    assert result[0][0]["id"] == "rare-0"


BAD_INPUTS = [  # (body, status, fragment of the message); the server runs with --max-topk 10 --max-queries 8
    (b"{not json", 400, "not valid JSON"),                   # --max-query-chars 64
    (b'{"queries": ["\xff\xfe"]}', 400, "not UTF-8"),
    (b"[" * 5000 + b"]" * 5000, 400, "not valid JSON"),      # nesting deeper than the parser's recursion limit
    (b'["river"]', 422, "JSON object"),
    (b"{}", 422, "'queries' is missing"),
    (b'{"queries": "river"}', 422, "list of strings"),
    (b'{"queries": ["river", 3]}', 422, "queries[1] must be a string"),
    (b'{"queries": ["river", ""]}', 422, "queries[1] is empty"),
    (b'{"queries": ["   "]}', 422, "queries[0] is empty"),
    (b'{"queries": ["river"], "topk": 0}', 422, "between 1 and 10"),
    (b'{"queries": ["river"], "topk": 11}', 422, "between 1 and 10"),
    (b'{"queries": ["river"], "topk": "3"}', 422, "must be an integer"),
    (b'{"queries": ["river"], "topk": true}', 422, "must be an integer"),
    (b'{"queries": ["river"], "topk": 2.5}', 422, "must be an integer"),
    (b'{"queries": ["river"], "return_scores": "yes"}', 422, "return_scores"),
    (json.dumps({"queries": ["river"] * 9}).encode(), 413, "limit is 8"),
    (json.dumps({"queries": ["r" * 65]}).encode(), 413, "limit is 64"),
    (json.dumps({"queries": ["river"], "pad": "x" * 20000}).encode(), 413, "request body"),
]


@pytest.mark.parametrize(("body", "status", "fragment"), BAD_INPUTS)
def test_bad_input_gets_a_clear_4xx(bm25_server, body, status, fragment):
    """Guards against malformed or oversized requests crashing the server, hanging, or answering 500."""
    response = httpx.post(bm25_server.url + "/retrieve", content=body, timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert fragment in response.json()["detail"]
    assert _post(bm25_server, {"queries": ["river"], "topk": 1}).status_code == 200  # still serving


def test_empty_list_oversized_stream_and_wrong_method(bm25_server):
    """Guards against an empty batch being an error, a body without Content-Length bypassing the size limit,
    and wrong methods falling through to a 500."""
    assert _post(bm25_server, {"queries": []}).json() == {"result": []}
    chunks = (b'{"queries": ["' + b"r" * 1000 + b'"' for _ in range(30))  # chunked transfer, ~30 kB
    response = httpx.post(bm25_server.url + "/retrieve", content=chunks, timeout=30)
    assert response.status_code == 413
    assert httpx.get(bm25_server.url + "/retrieve").status_code == 405
    assert httpx.get(bm25_server.url + "/health").status_code == 200


def test_concurrent_requests_each_get_their_own_results(bm25_server):
    """Guards against the coalescing of concurrent requests handing one request another's hits or topk."""
    jobs = [([f"{PASSAGES[i][1]} history", "river bridges"][: 1 + i % 2], 1 + i % 5) for i in range(16)]
    sequential = [_post(bm25_server, {"queries": q, "topk": k}).json() for q, k in jobs]
    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(lambda job: _post(bm25_server, {"queries": job[0], "topk": job[1]}).json(), jobs))
    assert concurrent == sequential
    assert all(len(docs) == k for (_, k), answer in zip(jobs, concurrent, strict=True) for docs in answer["result"])


def test_edited_corpus_is_refused_while_loading(bm25_index, corpus_path, tmp_path):
    """Guards against serving an index over a corpus edited in place (same size, different bytes): the ids
    would return the wrong passages."""
    edited = tmp_path / "corpus.jsonl"
    edited.write_text(corpus_path.read_text().replace("Kelbrook", "Kelbroox", 1))
    with ServerProcess(bm25_index, edited, ["--threads", "1"]) as server:
        assert server.wait_exit(timeout=120) == 1
        assert "corpus mismatch" in server.log_text() and "sha256" in server.log_text()


def test_wrong_corpus_or_missing_index_is_refused_before_binding(bm25_index, corpus_path, tmp_path):
    """Guards against a server that starts (and looks healthy) over an index that cannot match its corpus."""
    longer = tmp_path / "corpus.jsonl"
    longer.write_text(corpus_path.read_text() + '{"id": "extra", "contents": "\\"Extra\\"\\nmore"}\n')
    with ServerProcess(bm25_index, longer) as server:
        assert server.wait_exit(timeout=60) == 2
        assert "corpus mismatch" in server.log_text() and "Uvicorn running" not in server.log_text()
    with ServerProcess(tmp_path / "no_index", corpus_path) as server:
        assert server.wait_exit(timeout=60) == 2
        assert "no manifest.json" in server.log_text()


@pytest.fixture(scope="module")
def other_encoder(tmp_path_factory):
    """A different real encoder: a tiny randomly initialised BERT (MiniLM's tokenizer), 32-dim, saved as a plain
    HF model (sentence-transformers adds mean pooling when it loads it)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_other_encoder_is_refused(flat_index, corpus_path, other_encoder):
    """Guards against querying an index with an encoder it was not built with (meaningless vectors)."""
    with ServerProcess(flat_index, corpus_path, ["--threads", "1", "--model", str(other_encoder)]) as server:
        assert server.wait_exit(timeout=180) == 1
        assert "encoder mismatch" in server.log_text() and "dim 32" in server.log_text()
