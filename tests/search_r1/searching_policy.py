"""A tiny real policy that searches twice before it answers, over real-sized passages (shared by the tests of
Search-R1's lengths and the acceptance run of issue 37).

``two_search_policy`` trains a tiny Qwen2 model (``data_prep.tiny_model``) for the given tokenizer until greedy
decoding reproduces, for each of ``QUESTIONS``, two ``<think> .. </think><search> query </search>`` turns, each
followed by the ``<information>`` block the real retrieval service returns (as the loop inserts it), then an
answer; a few more steps sharpen it so that sampling at temperature 1 follows it too.
"""

from __future__ import annotations

import torch

from data_prep.tiny_model import build_model
from search_r1.llm_agent.formatting import observation_ids
from search_r1.prompts import make_prompt
from search_r1.search.client import RetrievalClient
from tests.search_r1.memorised_policy import memorise

# question -> (two queries, answer): the topics of tests/search_r1/long_passages.py
QUESTIONS = {"Which river flows through the capital of France": (["capital of France Paris", "Seine river"], "Seine"),
             "Where was the physicist who discovered radium born": (["Curie Nobel radium", "Curie born"], "Warsaw")}


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def two_search_policy(tokenizer, out, service_url: str, topk: int = 3, max_obs_length: int = 500,
                      sharpen_steps: int = 60) -> tuple[str, list[int]]:
    """Train and save the policy to ``out`` -> (model dir, the inserted tokens of each question's trajectory)."""
    client = RetrievalClient(service_url, topk)
    examples, inserted = [], []
    for question, (queries, answer) in QUESTIONS.items():
        ids = tokenizer.apply_chat_template([{"role": "user", "content": make_prompt(question)}],
                                            add_generation_prompt=True, tokenize=True, return_dict=False)
        labels = [-100] * len(ids)
        inserted.append(0)
        for query in queries:
            act = _encode(tokenizer, f"<think> I need to search </think><search> {query} </search>")
            (info, _), = observation_ids(tokenizer, client.search([query]), max_obs_length)
            ids, labels = ids + act + info, labels + act + [-100] * len(info)
            inserted[-1] += len(info)
        final = _encode(tokenizer, f"<think> found it </think><answer> {answer} </answer>")
        examples.append((ids + final, labels + final))
    torch.manual_seed(0)
    model = build_model(tokenizer)
    memorise(model, examples)
    memorise_more(model, examples, sharpen_steps)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out), inserted


def memorise_more(model, examples: list[tuple[list[int], list[int]]], steps: int) -> None:
    """More steps on the labelled tokens after greedy decoding is right, so sampled decoding follows too."""
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        for ids, labels in examples:
            target = torch.tensor(labels[1:])  # [T-1]
            keep = target != -100
            hidden = model.model(torch.tensor([ids])).last_hidden_state[0, :-1][keep]  # [K, H]
            torch.nn.functional.cross_entropy(model.lm_head(hidden), target[keep]).backward()
        optimiser.step()
        optimiser.zero_grad()
