"""Helpers of the rollout-engine tests: the fine-tuned tiny policy and its fixtures, plain reference loops.

The fixtures are defined here and imported by the ``conftest.py`` of ``tests/verl/workers/rollout``
and ``tests/verl/single_controller``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_prep.tiny_model import save_tiny_model
from tests.shared_builds import built_once

FACTS = [
    ("the capital of france", "paris"), ("the tallest mountain", "everest"), ("the author of hamlet", "shakespeare"),
    ("the largest ocean", "pacific"), ("the longest river", "nile"), ("the first president", "washington"),
    ("the painter of the mona lisa", "da vinci"), ("the capital of japan", "tokyo"),
]


def trace(question: str, answer: str) -> str:
    """One Search-R1-style trajectory text ending in eos."""
    return (f"<think> i need to find {question} </think> <search> {question} </search> "
            f"<information> {question} is {answer} </information> <answer> {answer} </answer><|im_end|>")


def traces(count: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [trace(*rng.choice(FACTS)) for _ in range(count)]


def fine_tune(model_dir: Path, texts: list[str], steps: int = 100, batch_size: int = 16) -> None:
    """A few AdamW steps of next-token training on ``texts``; overwrites the weights in ``model_dir``."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        batch = texts[(step * batch_size) % len(texts):][:batch_size]
        enc = tokenizer(batch, return_tensors="pt", padding=True, padding_side="right")
        labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)  # [B, T]
        model(**enc, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(model_dir)


def perturbed(state: dict[str, torch.Tensor], scale: float = 1.0, seed: int = 1) -> dict[str, torch.Tensor]:
    """A copy of ``state`` with Gaussian noise of ``scale`` x each tensor's std added (a different, sane model)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: t + scale * t.std().clamp_min(1e-3) * torch.randn(t.shape, generator=gen)
            for name, t in state.items()}


def greedy_loop(model, prompt: list[int], max_tokens: int, eos_id: int) -> list[int]:
    """Plain greedy decoding: one full forward pass per token, no KV cache, no batching, no padding."""
    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            out.append(token)
            if token == eos_id:
                break
    return out


def raw_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    """log p(response[t] | prompt + response[:t]) under the model's raw logits, one forward pass per token."""
    values = []
    with torch.no_grad():
        for t in range(len(response)):
            logits = model(torch.tensor([prompt + response[:t]])).logits[0, -1]
            values.append(float(torch.log_softmax(logits.float(), dim=-1)[response[t]]))
    return values


def build_policy(out: Path) -> Path:
    """The tiny model + tokenizer of ``traces()``, fine-tuned on them, saved in ``out``."""
    texts = traces()
    save_tiny_model(out, texts, vocab_size=512)
    fine_tune(out, texts)
    return out


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """Directory of the fine-tuned tiny model + tokenizer (built once per test run, ``built_once``)."""
    return built_once(tmp_path_factory, "rollout_tiny_policy", build_policy)


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
