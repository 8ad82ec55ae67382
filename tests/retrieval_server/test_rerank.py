"""The cross-encoder rerank stage, with a tiny real CrossEncoder built here (BERT config + a WordPiece tokenizer
trained on the test corpus, saved with save_pretrained): the service returns the first stage's candidates in
the order of the cross-encoder's own scores."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from retrieval_server.launcher import ServerProcess
from retrieval_server.search.rerank import Reranker, RerankerError
from tests.retrieval_server.retrieval_test_corpus import PASSAGES

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

CONTENTS = {pid: f'"{title}"\n{text}' for pid, title, text in PASSAGES}
QUERIES = ["Which river flows into the Sallow Sea?", "who made glass in Kelbrook", "cheese aged in caves",
           "a telescope made of brass", "folk songs about ferrymen"]
RERANK_TOPK = 8


def _tiny_cross_encoder(path, num_labels: int) -> None:
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(list(CONTENTS.values()) + QUERIES,
                                  trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = BertTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=fast.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=num_labels,
                        initializer_range=0.5)  # wide weights: scores spread out, so the order is clear
    BertForSequenceClassification(config).save_pretrained(path)
    fast.save_pretrained(path)


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_cross_encoder")
    _tiny_cross_encoder(path, num_labels=1)
    return path


def _post(server: ServerProcess, topk: int) -> list[list[tuple[str, float]]]:
    result = httpx.post(server.url + "/retrieve", json={"queries": QUERIES, "topk": topk, "return_scores": True},
                        timeout=60).json()["result"]
    return [[(hit["document"]["id"], hit["score"]) for hit in hits] for hits in result]


def test_reranked_answers_follow_the_cross_encoders_scores(cross_encoder, flat_index, corpus_path, flat_server):
    """Guards against the rerank stage being skipped, scoring other pairs than (query, candidate contents),
    sorting the wrong way, keeping first-stage scores, or cutting candidates before reranking."""
    from sentence_transformers import CrossEncoder

    first_stage = _post(flat_server, RERANK_TOPK)  # the same flat index without a reranker
    model = CrossEncoder(str(cross_encoder), device="cpu")  # loaded independently of the service
    expected = []
    for query, hits in zip(QUERIES, first_stage, strict=True):
        ids = [doc for doc, _ in hits]
        scores = model.predict([(query, CONTENTS[doc]) for doc in ids])
        order = sorted(range(len(ids)), key=lambda i: -scores[i])  # Python's sort is stable: ties keep retrieval order
        expected.append([(ids[i], float(scores[i])) for i in order])
    args = ["--threads", "1", "--reranker", str(cross_encoder), "--rerank-topk", str(RERANK_TOPK), "--max-topk", "20"]
    with ServerProcess(flat_index, corpus_path, args) as server:
        health = server.wait_ready()
        assert (health["reranker"], health["rerank_topk"]) == (str(cross_encoder), RERANK_TOPK)
        reranked = _post(server, 3)
        wider = _post(server, 12)  # topk above --rerank-topk: 12 candidates are reranked
    for got, want in zip(reranked, expected, strict=True):
        assert [doc for doc, _ in got] == [doc for doc, _ in want[:3]]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want[:3]], rtol=1e-4)
    assert any([d for d, _ in got] != [d for d, _ in first[:3]] for got, first in zip(reranked, first_stage,
                                                                                     strict=True))
    assert all(len(hits) == 12 for hits in wider)
    assert all([s for _, s in hits] == sorted((s for _, s in hits), reverse=True) for hits in wider)


def test_a_model_with_several_outputs_is_refused(tmp_path):
    """Guards against serving a classifier with several labels as a reranker (which score would rank?)."""
    _tiny_cross_encoder(tmp_path / "two", num_labels=2)
    with pytest.raises(RerankerError, match="num_labels=1"):
        Reranker(str(tmp_path / "two"), device="cpu")
    with pytest.raises(RerankerError, match="is not a directory"):
        Reranker(str(tmp_path / "missing"), device="cpu")
