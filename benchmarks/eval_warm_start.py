"""How good is the warm-started tiny policy, and how much room does it leave RL? Prints figures.

    python benchmarks/eval_warm_start.py --model data/demo/tiny_policy --data data/demo \\
        --retriever-url http://127.0.0.1:8000 [--split test] [--samples 4]

Rolls out test questions with HF ``generate`` turn by turn against the running retrieval service (a small loop
of its own, in the agent loop's token layout: stop at ``</search>``/``</answer>``/eos, insert the passages as
the loop does (``observation_ids``: cut to ``max_obs_length``), at most ``max_turns`` searches, response
budget ``max_response_length``; a turn is cut at ``max_turn_tokens``, far above what a well-formed turn
takes), and prints EM overall and per data_source, the fraction of trajectories that
search, EM when the policy searches vs when it does not, searches per trajectory per data_source, and the same
with the correct behaviour forced: the first turn starts with the search decision (``forced search``), and
additionally every turn after a passage block on a two-hop question starts with the search-again decision
(``forced chain``). ``--samples`` adds temperature-1.0 rollouts: how often sampling picks the good behaviour.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_prep.demo_kb import MULTI, Question, load_questions
from data_prep.tiny_policy import SearchFn, observation_ids, prompt_ids
from search_r1.reward.qa_em import em_check, extract_answer

FORCE_SEARCH = "<think> Let me"  # the first words of the scripted agent's search decision
FORCE_NEXT_HOP = "<think> One more"  # ... and of its search-again decision


@dataclass
class Rollout:
    question: Question
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    searches: int = 0
    done: bool = False


def _generate(model, tokenizer, contexts: list[list[int]], max_new: int, temperature: float) -> list[list[int]]:
    """Continue each context until a stop token; returns the new ids per row (stop token included)."""
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("</search>", "</answer>")] + [tokenizer.eos_token_id]
    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])  # [B, T] left-padded
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=stop_ids,
                             pad_token_id=pad, **sampling)
    new = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        new.append(row[:cut])
    return new


def rollout(model, tokenizer, questions: list[Question], search: SearchFn, temperature: float = 0.0,
            force_search: bool = False, force_chain: bool = False, max_turns: int = 3,
            max_response_length: int = 320, max_obs_length: int = 96, max_turn_tokens: int = 80,
            batch_size: int = 64) -> list[Rollout]:
    """Multi-turn rollouts of ``questions`` (see the module docstring for the loop)."""
    search_close = tokenizer.convert_tokens_to_ids("</search>")
    force_first = tokenizer.encode(FORCE_SEARCH, add_special_tokens=False)
    force_next = tokenizer.encode(FORCE_NEXT_HOP, add_special_tokens=False)
    rows = [Rollout(q, prompt_ids(tokenizer, q.question)) for q in questions]
    for turn in range(max_turns + 1):
        active = [r for r in rows if not r.done]
        for r in active:
            if force_search and turn == 0:
                r.response += force_first
            elif force_chain and 0 < turn < len(r.question.chain) and r.question.data_source == MULTI:
                r.response += force_next
        searching, queries = [], []
        for start in range(0, len(active), batch_size):
            chunk = active[start:start + batch_size]
            budget = max(max_response_length - len(r.response) for r in chunk)
            max_new = max(1, min(budget, max_turn_tokens))
            outs = _generate(model, tokenizer, [r.prompt + r.response for r in chunk], max_new, temperature)
            for r, new in zip(chunk, outs, strict=True):
                new = new[:max_response_length - len(r.response)]
                r.response += new
                text = tokenizer.decode(new, skip_special_tokens=True)
                query = text.rsplit("<search>", 1)[-1].replace("</search>", "").strip()
                if new and new[-1] == search_close and "<search>" in text and query and turn < max_turns:
                    searching.append(r)
                    queries.append(query)
                else:  # answered, ran out of budget or turns, or an invalid (empty) search: the rollout ends
                    r.done = True
        if searching:
            for r, docs in zip(searching, search(queries), strict=True):
                r.response += observation_ids(tokenizer, docs, max_obs_length)
                r.searches += 1
                r.done = len(r.response) >= max_response_length
    return rows


def score(tokenizer, rows: list[Rollout]) -> list[float]:
    """EM of the answer in each response (the last <answer> block; 0 without one)."""
    scores = []
    for r in rows:
        answer = extract_answer(tokenizer.decode(r.response, skip_special_tokens=True))
        scores.append(0.0 if answer is None else em_check(answer, r.question.answers))
    return scores


def report(name: str, tokenizer, rows: list[Rollout]) -> dict[str, float]:
    """Print and return the figures of one set of rollouts."""
    em = score(tokenizer, rows)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    by_source = defaultdict(list)
    for r, s in zip(rows, em, strict=True):
        by_source[r.question.data_source].append((s, r.searches))
    figures = {"em": mean(em), "search_frac": mean([float(r.searches > 0) for r in rows]),
               "em_searched": mean([s for r, s in zip(rows, em, strict=True) if r.searches > 0]),
               "em_no_search": mean([s for r, s in zip(rows, em, strict=True) if r.searches == 0])}
    for source, pairs in sorted(by_source.items()):
        figures[f"em/{source}"] = mean([s for s, _ in pairs])
        figures[f"searches/{source}"] = mean([float(n) for _, n in pairs])
    print(f"{name:>22}: " + "  ".join(f"{k}={v:.3f}" for k, v in figures.items()))
    return figures


def evaluate(model_dir: str, questions: list[Question], search: SearchFn, samples: int = 0,
             seed: int = 0) -> dict[str, dict[str, float]]:
    """Greedy, forced-search, forced-chain and (``samples`` times) temperature-1 rollouts; prints figures."""
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    results = {}
    for name, kwargs in [("greedy", {}), ("greedy forced search", {"force_search": True}),
                         ("greedy forced chain", {"force_search": True, "force_chain": True})]:
        start = time.time()
        results[name] = report(name, tokenizer, rollout(model, tokenizer, questions, search, **kwargs))
        print(f"{'':>22}  ({time.time() - start:.1f}s)")
    if samples:
        torch.manual_seed(seed)
        rows = [r for _ in range(samples) for r in rollout(model, tokenizer, questions, search, temperature=1.0)]
        results["sampled"] = report(f"T=1.0 x{samples}", tokenizer, rows)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="data/demo/tiny_policy")
    parser.add_argument("--data", default="data/demo")
    parser.add_argument("--retriever-url", default="http://127.0.0.1:8000")
    parser.add_argument("--split", default="test")
    parser.add_argument("--samples", type=int, default=4, help="temperature-1.0 rollouts per question")
    args = parser.parse_args()
    from search_r1.search.client import RetrievalClient

    questions = load_questions(args.data, args.split)
    print(f"{len(questions)} {args.split} questions, model {args.model}")
    evaluate(args.model, questions, RetrievalClient(args.retriever_url, topk=3).search, args.samples)


if __name__ == "__main__":
    main()
