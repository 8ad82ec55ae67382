"""A tiny real policy that memorised a search-then-answer trajectory per question (shared by the search_r1 tests).

``memorised_policy`` trains a tiny Qwen2 model (``data_prep.tiny_model``) for the given tokenizer until
greedy decoding reproduces, for each of ``QUESTIONS``, ``<think> .. </think><search> query </search>``,
the passages the real retrieval service returns (as the loop inserts them), then
``<think> found it </think><answer> answer </answer>``.
"""

from __future__ import annotations

import torch

from data_prep.tiny_model import build_model
from search_r1.llm_agent.formatting import observation_ids
from search_r1.prompts import make_prompt
from search_r1.search.client import RetrievalClient
from verl.utils.tokenizer import render_prompt

TOPK = 2
# question -> (query, answer); prompts of different lengths, so the engine left-pads one of them.
QUESTIONS = {"What is the capital of France": ("capital of France", "Paris"),
             "Which country has Tokyo as its capital city, the largest in the world": ("capital of Japan", "Japan")}


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def memorise(model, examples: list[tuple[list[int], list[int]]], steps: int = 400) -> None:
    """Train until greedy decoding reproduces every labelled token (labels -100 are free).

    The LM head runs on the labelled positions only, and the (tied) embedding stays as initialised: with a 151k
    vocabulary its gradient and Adam moments were most of the cost (15 steps in 9 s against 6 in 1.3 s), and the
    layers alone steer the hidden state onto any of the random embeddings."""
    embedding = model.get_input_embeddings().weight  # tied to the head: a 151k x H matrix's gradient and moments
    embedding.requires_grad_(False)
    try:
        optimiser = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
        for _ in range(steps):
            correct = True
            for ids, labels in examples:
                target = torch.tensor(labels[1:])  # [T-1]
                keep = target != -100
                hidden = model.model(torch.tensor([ids])).last_hidden_state[0, :-1][keep]  # [K, H]
                logits = model.lm_head(hidden)  # [K, V]
                loss = torch.nn.functional.cross_entropy(logits, target[keep])
                loss.backward()
                correct &= bool((logits.argmax(-1) == target[keep]).all())
            if correct:  # before the step: the weights returned are the ones that were checked
                return
            optimiser.step()
            optimiser.zero_grad()
    finally:
        embedding.requires_grad_(True)
    raise AssertionError("the tiny policy did not memorise its trajectories")


def memorised_policy(tokenizer, out, service_url, model=None, max_obs_length: int = 96):
    """A tiny model for ``tokenizer``'s vocabulary (``model``, else a Qwen2 one), saved to ``out``, that greedily
    searches once and then answers each question -> (model dir, tokenizer, prompts, expected responses, expected
    info masks). ``max_obs_length``: the loop's budget of one inserted block, which the passages must fit."""
    client = RetrievalClient(service_url, TOPK)
    prompts, responses, masks, examples = [], [], [], []
    for question, (query, answer) in QUESTIONS.items():
        prompt = render_prompt(tokenizer, [{"role": "user", "content": make_prompt(question)}])
        search = _encode(tokenizer, f"<think> I need to search </think><search> {query} </search>")
        (info, truncated), = observation_ids(tokenizer, client.search([query]), max_obs_length)
        assert not truncated, "keep the block under the default data.max_obs_length (used by infer)"
        final = _encode(tokenizer, f"<think> found it </think><answer> {answer} </answer>")
        prompts.append(prompt)
        responses.append(search + info + final)
        masks.append([1] * len(search) + [0] * len(info) + [1] * len(final))
        ids = prompt + search + info + final
        labels = [-100] * len(prompt) + search + [-100] * len(info) + final
        examples.append((ids, labels))
    if model is None:
        torch.manual_seed(0)
        model = build_model(tokenizer)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    memorise(model, examples)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, tokenizer, prompts, responses, masks
