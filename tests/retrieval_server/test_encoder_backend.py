"""ONNX Runtime encoder backend: the same embeddings and top-1 passages as torch, through the manifest check and
the real service; its export cached once per model and rebuilt when the cached file is broken; clear refusals."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from retrieval_server.index.encoder import DEFAULT_MODEL, PROBE_TEXT, Encoder, EncoderError
from retrieval_server.index.manifest import Manifest
from retrieval_server.launcher import ServerProcess
from retrieval_server.search.service import ServeOptions, load_retriever
from tests.retrieval_server.test_encoder_dtype import QUERIES

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`


def _retriever(flat_index, backend: str):
    return load_retriever(flat_index, Manifest.load(flat_index), ServeOptions(threads=1, encoder_dtype="fp32",
                                                                               encoder_backend=backend))


def test_onnx_embeds_like_torch_and_keeps_every_top_passage(flat_index):
    """Guards against an exported graph that embeds differently (wrong pooling, a dropped input such as
    token_type_ids, batches out of order), fails the manifest's fingerprint check, or silently stays torch."""
    torch_retriever, onnx_retriever = _retriever(flat_index, "torch"), _retriever(flat_index, "onnx")
    assert (torch_retriever.encoder.backend, onnx_retriever.encoder.backend) == ("torch", "onnx")
    queries = QUERIES + ["", "x" * 3000, QUERIES[0]]  # empty, truncated at the model's 256 tokens, a repeat
    reference, vectors = (r.encoder.encode_queries(queries) for r in (torch_retriever, onnx_retriever))
    assert vectors.shape == reference.shape and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert (vectors * reference).sum(axis=1).min() >= 0.9999
    for k in (1, 3):
        assert onnx_retriever.search(QUERIES, k)[1].tolist() == torch_retriever.search(QUERIES, k)[1].tolist()
    one_by_one = np.stack([onnx_retriever.encoder.encode_queries([q])[0] for q in QUERIES])
    np.testing.assert_allclose(one_by_one, vectors[:len(QUERIES)], atol=1e-5)  # batching changes nothing


def test_the_service_serves_onnx_by_default_on_cpu_with_torch_results(flat_index, corpus_path):
    """Guards against the default not reaching the server (``auto`` resolving to torch on a CPU) or the served
    passages differing from a torch server's."""
    answers = {}
    for args in ([], ["--encoder-backend", "torch"]):
        with ServerProcess(flat_index, corpus_path, ["--threads", "1", "--cache-size", "0", *args]) as server:
            health = server.wait_ready()
            request = {"queries": QUERIES, "topk": 3, "return_scores": False}
            response = httpx.post(f"{server.url}/retrieve", json=request, timeout=60)
            assert response.status_code == 200
            answers[health["encoder_backend"]] = [[d["id"] for d in hits]
                                                  for hits in response.json()["result"]]
    assert set(answers) == {"onnx", "torch"}
    assert answers["onnx"] == answers["torch"]


TORCH_FREE_START = """
import json, sys
from retrieval_server.index.encoder import DEFAULT_MODEL, Encoder
encoder = Encoder(DEFAULT_MODEL, query_prefix=sys.argv[1], device="cpu", backend="auto", dtype="auto", threads=1)
print(json.dumps({"backend": encoder.backend, "dtype": encoder.dtype,
                  "imported": sorted(m for m in ("torch", "sentence_transformers", "transformers") if m in sys.modules),
                  "vectors": encoder.encode_queries(json.loads(sys.argv[2])).tolist(),
                  "fingerprint": encoder.fingerprint().tolist()}))
"""


def _start(prefix: str, texts: list[str]) -> dict:
    """A service's encoder (device cpu, backend and dtype auto) built in a fresh process: what it imported, its
    vectors of ``texts`` and its fingerprint."""
    import json
    import subprocess
    import sys

    from tests.ray_cluster import ROOT

    done = subprocess.run([sys.executable, "-c", TORCH_FREE_START, prefix, json.dumps(texts)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # SEARCH_R1_CACHE: the test's
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_export_is_cached_a_start_from_it_loads_no_torch_and_a_broken_one_is_made_again(tmp_path, monkeypatch):
    """Guards against exporting at every start (~10-20 s); against a service start that pays for torch and
    sentence-transformers (~5 of a dense service's ~6 s on a CPU) once its model was exported, or that embeds
    differently from torch that way (its own tokenizer's truncation, padding and empty text, a query prefix, the
    manifest's fingerprint); and against a service that cannot start because the cached graph is unreadable
    (written by another ONNX Runtime, or damaged)."""
    from retrieval_server.index.manifest import PROBE_MIN_COSINE

    monkeypatch.setenv("SEARCH_R1_CACHE", str(tmp_path))
    (tmp_path / "onnx").mkdir()
    legacy = tmp_path / "onnx" / "104bfb745cfcada36f3a.onnx"  # an earlier version's graph, removed at the export
    legacy.write_bytes(b"\0" * 1000)
    first = Encoder(DEFAULT_MODEL, backend="onnx")
    assert not legacy.exists()
    cached = list((tmp_path / "onnx").glob("*/encoder.onnx"))
    assert cached == [first._onnx.path]
    stamp = cached[0].stat().st_mtime_ns
    Encoder(DEFAULT_MODEL, backend="onnx")
    assert cached[0].stat().st_mtime_ns == stamp  # loaded, not exported again

    texts = QUERIES + ["", "x " * 600]  # empty, truncated at the model's 256 tokens
    reference = first._encode_with(first.model, texts, "query: ")  # torch
    for prefix in ("query: ", ""):  # a bundle holds no prefix: one export serves both
        started = _start(prefix, texts)
        assert (started["backend"], started["dtype"], started["imported"]) == ("onnx", "fp32", [])
    started = _start("query: ", texts)
    assert (np.asarray(started["vectors"], dtype=np.float32) * reference).sum(axis=1).min() >= 0.9999
    assert np.asarray(started["fingerprint"]) @ first._encode_with(first.model, [PROBE_TEXT], "query: ")[0] \
        >= PROBE_MIN_COSINE
    assert cached[0].stat().st_mtime_ns == stamp

    cached[0].write_bytes(b"not an ONNX model")
    again = _start("", texts)  # loads torch, exports again
    assert again["backend"] == "onnx" and "torch" in again["imported"] and cached[0].stat().st_size > 1_000_000
    assert _start("", texts)["imported"] == []
    assert list((tmp_path / "onnx").iterdir()) == [cached[0].parent]  # no temporary directory left behind
    np.testing.assert_allclose(np.asarray(again["vectors"])[:len(QUERIES)], first.encode_queries(QUERIES), atol=1e-5)


def test_backend_choices_and_refusals(tmp_path, monkeypatch):
    """Guards against onnx silently serving a half-precision request in fp32, auto picking onnx where it cannot
    run it or failing to start where the export fails (here: a cache directory that cannot be made), and an
    unknown backend name being accepted."""
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("SEARCH_R1_CACHE", str(tmp_path / "a_file"))  # cache_dir() would be a_file/onnx
    assert Encoder(DEFAULT_MODEL, backend="auto").backend == "torch"
    with pytest.raises(EncoderError, match="ONNX export of the encoder failed.*--encoder-backend torch"):
        Encoder(DEFAULT_MODEL, backend="onnx")
    with pytest.raises(EncoderError, match="runs in fp32, not bf16"):
        Encoder(DEFAULT_MODEL, dtype="bf16", backend="onnx")
    assert Encoder(DEFAULT_MODEL, dtype="bf16", backend="auto").backend == "torch"
    with pytest.raises(ValueError, match="must be one of"):
        Encoder(DEFAULT_MODEL, backend="openvino")
    with pytest.raises(ValueError, match="must be one of"):
        ServeOptions(encoder_backend="tensorrt")


def _tiny_roberta_sentence_transformer(path) -> str:
    """A sentence-transformers model unlike MiniLM: RoBERTa, a tokenizer without token_type_ids, CLS pooling, a
    Dense head, 64-token truncation (random weights, a WordPiece vocabulary trained on the test queries)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast, RobertaConfig, RobertaModel

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(QUERIES * 3, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")),
                                                 ("[SEP]", tokenizer.token_to_id("[SEP]"))])
    fast = BertTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"])
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=fast.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, pad_token_id=0, type_vocab_size=1)
    RobertaModel(config).save_pretrained(path / "hf")
    fast.save_pretrained(path / "hf")
    modules = [Transformer(str(path / "hf"), max_seq_length=64), Pooling(32, pooling_mode="cls"),
               Dense(32, 16, activation_function=torch.nn.Tanh()), Normalize()]
    SentenceTransformer(modules=modules).save(str(path / "st"))
    return str(path / "st")


def test_another_architecture_exports_with_its_own_inputs_pooling_and_head(tmp_path, monkeypatch):
    """Guards against a backend that only works for BERT with mean pooling: a model without token_type_ids
    must not be fed them, CLS pooling and a Dense head must stay the model's own, prefixes and truncation apply."""
    monkeypatch.setenv("SEARCH_R1_CACHE", str(tmp_path / "cache"))
    model = _tiny_roberta_sentence_transformer(tmp_path)
    queries = QUERIES + ["", "x " * 300]
    torch_encoder = Encoder(model, query_prefix="query: ", backend="torch")
    onnx_encoder = Encoder(model, query_prefix="query: ", backend="onnx")
    assert onnx_encoder.backend == "onnx" and onnx_encoder._onnx.names == ["input_ids", "attention_mask"]
    reference, vectors = torch_encoder.encode_queries(queries), onnx_encoder.encode_queries(queries)
    assert vectors.shape == (len(queries), 16)
    assert (vectors * reference).sum(axis=1).min() >= 0.9999
