"""Fixtures of the agent-loop tests: real tokenizers (tiny and Qwen2.5) and a scripted engine.

The scripted engine is a real implementation of ``RolloutEngine`` whose "policy" is a fixed list of
texts per row and turn (tokenised with the real tokenizer); it honours ``max_tokens``, the stop
strings and EOS the way an engine must, and records every call. The retrieval service and its corpus
are fixtures of ``tests/search_r1/conftest.py``.
"""

from __future__ import annotations

import pytest

from data_prep.tiny_model import train_tokenizer
from verl.workers.rollout.base import GenerationOutput, SamplingParams


@pytest.fixture(scope="session", params=["tiny", "qwen"])
def tokenizer(request, corpus_texts):
    """Each test runs with two real tokenizers: the tiny BPE one (tags and chat tokens are single tokens), and
    Qwen2.5's 151k vocabulary (``</search>`` is three tokens whose last one can merge with what follows)."""
    if request.param == "qwen":
        return request.getfixturevalue("qwen_tokenizer")
    texts = corpus_texts + ["Answer the question. <think> I should search. </think> <search> capital of France "
                              "</search> <answer> Paris </answer> Question: What is the capital of Germany?"] * 5
    return train_tokenizer(texts, vocab_size=600)


class ScriptedEngine:
    """A ``RolloutEngine`` that plays fixed texts: ``scripts[prompt][turn]`` is what that row writes.

    A text ending in ``<|im_end|>`` emits the EOS id. Generation stops after the first stop string
    (included), at EOS, or after ``max_tokens`` tokens, like vLLM. ``calls`` records
    ``(contexts, params)`` of every ``generate`` call.
    """

    def __init__(self, tokenizer, scripts: dict[tuple[int, ...], list[str]]):
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.turn_of = dict.fromkeys(scripts, 0)
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []
        self.emitted: dict[tuple[int, ...], list[list[int]]] = {p: [] for p in scripts}  # full output per turn
        self.before_call = None  # optional hook(call_index) run before each generate

    def expect_prompts_cut(self, n: int) -> None:
        """The loop will drop the first ``n`` tokens of every prompt: key the scripts by what is left."""
        self.scripts = {p[n:]: turns for p, turns in self.scripts.items()}
        self.turn_of = dict.fromkeys(self.scripts, 0)
        self.emitted = {p: [] for p in self.scripts}

    def row_of(self, context: list[int]) -> tuple[int, ...]:
        matches = [p for p in self.scripts if tuple(context[:len(p)]) == p]
        assert len(matches) == 1, "context does not start with exactly one scripted prompt"
        return matches[0]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        if self.before_call is not None:
            self.before_call(len(self.calls))
        self.calls.append(([list(p) for p in prompts], params))
        outputs = []
        for context in prompts:
            key = self.row_of(context)
            text = self.scripts[key][self.turn_of[key]]
            self.turn_of[key] += 1
            outputs.append(self._play(text, params))
            self.emitted[key].append(outputs[-1].token_ids)
        return outputs

    def _play(self, text: str, params: SamplingParams) -> GenerationOutput:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        out: list[int] = []
        for tid in ids:
            if len(out) == params.max_tokens:
                return GenerationOutput(out, "length")
            out.append(tid)
            if tid == self.tokenizer.eos_token_id:
                return GenerationOutput(out, "stop")
            decoded = self.tokenizer.decode(out)
            for stop in params.stop:
                if stop in decoded:
                    return GenerationOutput(out, "stop", stop)
        raise AssertionError(f"script text ended without a stop, EOS or length: {text!r}")

    def sync_weights(self, named_tensors) -> None:
        raise NotImplementedError("a scripted policy has no weights")


@pytest.fixture
def make_engine(tokenizer):
    """``make_engine({prompt_text: [turn texts]})`` -> (engine, prompt ids in the order given)."""
    def make(scripts: dict[str, list[str]]) -> tuple[ScriptedEngine, list[list[int]]]:
        prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in scripts]
        by_prompt = {tuple(p): turns for p, turns in zip(prompts, scripts.values(), strict=True)}
        engine = ScriptedEngine(tokenizer, by_prompt)
        return engine, prompts
    return make
