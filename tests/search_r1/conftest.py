"""Fixtures of the search_r1 tests: the real retrieval service on loopback and a tiny memorising policy.

The retrieval service is the project's own FastAPI service over a BM25 index of a small corpus, started
on a free loopback port (``retrieval_server.launcher``). The policy (``memorised_policy``) is a tiny
Qwen2 model trained in the test session until greedy decoding reproduces a search-then-answer
trajectory for each of ``QUESTIONS``, with the passages the service really returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from data_prep.tiny_model import train_tokenizer
from retrieval_server.launcher import ServerProcess, free_port
from search_r1.prompts import INSTRUCTION
from tests.search_r1.memorised_policy import QUESTIONS, memorised_policy
from tests.shared_builds import built_once

ROOT = Path(__file__).resolve().parents[2]

CORPUS = [
    ("paris", "Paris", "Paris is the capital and largest city of France, on the river Seine."),
    ("berlin", "Berlin", "Berlin is the capital of Germany and its largest city by population."),
    ("everest", "Mount Everest", "Mount Everest is the highest mountain above sea level, in the Himalayas."),
    ("nile", "Nile", "The Nile is a major river in Africa flowing north into the Mediterranean Sea."),
    ("curie", "Marie Curie", "Marie Curie was a physicist and chemist who won two Nobel prizes for radioactivity. "
                             "She was born in Warsaw and worked in Paris, where she discovered polonium and radium "
                             "with Pierre Curie; she was the first woman to win a Nobel prize."),
    ("tokyo", "Tokyo", "Tokyo is the capital of Japan and one of the most populous cities in the world."),
]


def _corpus_texts() -> list[str]:
    return [f"{title}. {text}" for _, title, text in CORPUS]


@pytest.fixture(scope="session")
def corpus_texts() -> list[str]:
    """The texts of the corpus the test service indexes (to train tokenizers on)."""
    return _corpus_texts()



@pytest.fixture
def unused_url() -> str:
    """A loopback URL on which nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="session")
def retrieval_index(tmp_path_factory) -> tuple[Path, Path]:
    """A BM25 index of ``CORPUS`` built by the project's index builder -> (corpus path, index dir)."""
    root = tmp_path_factory.mktemp("retrieval")
    corpus = root / "corpus.jsonl"
    with corpus.open("w") as f:
        for doc_id, title, text in CORPUS:
            f.write(json.dumps({"id": doc_id, "contents": f'"{title}"\n{text}'}) + "\n")
    index = root / "index"
    subprocess.run([sys.executable, "-m", "retrieval_server.build_index", "--corpus", str(corpus), "--out",
                    str(index), "--retriever", "bm25"], cwd=ROOT, check=True, capture_output=True, timeout=300)
    return corpus, index


@pytest.fixture(scope="session")
def service_url(retrieval_index):
    """URL of a retrieval service shared by the tests that do not stop it."""
    corpus, index = retrieval_index
    with ServerProcess(index, corpus) as server:
        server.wait_ready()
        yield server.url


@pytest.fixture
def own_service(retrieval_index):
    """A service only this test uses (it may ``stop()`` it); stopped at teardown in any case."""
    corpus, index = retrieval_index
    with ServerProcess(index, corpus) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="session")
def policy(tmp_path_factory, service_url, corpus_texts):
    """The memorising policy on the tiny tokenizer (tags are single tokens)
    -> (model dir, tokenizer, prompts, expected responses, expected info masks). Trained once per test run
    (``built_once``: the worker that asks first trains it and records the trajectories; the others read them, and
    the tokenizer saved with the model)."""
    def build(out: Path) -> None:
        tokenizer = train_tokenizer(corpus_texts + [INSTRUCTION] * 3 + list(QUESTIONS) * 3, vocab_size=700)
        _, _, prompts, responses, masks = memorised_policy(tokenizer, out / "model", service_url)
        (out / "trajectories.json").write_text(json.dumps({"prompts": prompts, "responses": responses,
                                                            "masks": masks}))

    built = built_once(tmp_path_factory, "memorised_policy", build)
    recorded = json.loads((built / "trajectories.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(built / "model")
    return built / "model", tokenizer, recorded["prompts"], recorded["responses"], recorded["masks"]


@pytest.fixture(scope="session")
def long_service_url(tmp_path_factory):
    """A BM25 service over real-sized passages (``long_passages``: three make a 430-520 token block in Qwen2.5)."""
    from tests.search_r1.long_passages import write_corpus

    root = tmp_path_factory.mktemp("long")
    corpus = write_corpus(root / "corpus.jsonl")
    index = root / "index"
    subprocess.run([sys.executable, "-m", "retrieval_server.build_index", "--corpus", str(corpus), "--out",
                    str(index), "--retriever", "bm25"], cwd=ROOT, check=True, capture_output=True, timeout=300)
    with ServerProcess(index, corpus) as server:
        server.wait_ready()
        yield server.url
