"""Fixtures of the rollout-engine tests: a tiny real Qwen2 model that has learnt the search-loop format.

The model is built with ``data_prep.tiny_model.save_tiny_model`` (tokenizer trained on a few hundred
templated Search-R1-style traces) and then fine-tuned for 100 small steps on those traces, so its
greedy continuation of "... <search>" is a query then "</search>", and answers end in "</answer>"
then eos: real behaviour to exercise stop strings and eos with, and peaked distributions so greedy
comparisons between engines are not decided by float noise near ties.

Torch runs single-threaded in these tests: the 2-core machine is shared, and two OpenMP threads
spin-waiting against other processes made the fine-tuning ~30x slower than one thread.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rollout_helpers import fine_tune, traces
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_prep.tiny_model import save_tiny_model


@pytest.fixture(scope="session", autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """Directory of the fine-tuned tiny model + tokenizer (built once per test session)."""
    texts = traces()
    out = save_tiny_model(tmp_path_factory.mktemp("tiny_policy"), texts, vocab_size=512)
    fine_tune(out, texts)
    return out


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir):
    """The same weights as a plain transformers model, for the reference loops of the tests."""
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    """Prompts of different lengths (so left padding is exercised), some in the trained format, some not."""
    texts = [
        "<think> i need to find the capital of france </think> <search>",
        "<think> i need to find the longest river </think> <search> the longest river </search> <information>",
        "<think> i need",
        "the tallest mountain is everest </information> <answer>",
        "hamlet",
    ]
    return [tokenizer.encode(text) for text in texts]


@pytest.fixture(scope="session")
def state_dict(hf_model) -> dict[str, torch.Tensor]:
    """The saved weights under HF names (what the actor syncs)."""
    return {name: t.clone() for name, t in hf_model.state_dict().items()}
