"""How good is the warm-started tiny policy, and how much room does it leave RL? Prints figures.

    python benchmarks/eval_warm_start.py --model data/demo/tiny_policy --data data/demo \\
        --retriever-url http://127.0.0.1:8000 [--split test] [--samples 4]

Rolls out the demo's test questions with the training loop itself (``search_r1.evaluate.build_agent``:
the search agent loop (``search_agent``) over the HF engine, lengths and ``max_turns`` from ``configs/demo.yaml``,
EM under ``reward.normalize``), and prints EM overall and per data_source, the fraction of trajectories
that search, EM when the policy searches vs when it does not, and searches per trajectory per
data_source; then the same with the correct plan forced through the loop's ``turn_prefix``: the first turn
starts with the one-search plan (``forced search``), or with the plan that fits the question, two hops on a
two-hop question (``forced chain``); the turns after a passage block are the policy's own.
``--samples`` adds temperature-1.0 rollouts: how often sampling picks the good behaviour.
``--teacher-forced N`` adds, on N scripted full-chain trajectories of the split (the scripted agent of the
warm start, never guessing or stopping early), per data_source the probability of each plan at the first
``<think>`` (guess / one search / two hops) and of searching again after each passage block, and the mean
negative log-likelihood of the policy's tokens per turn: where a skill is missing, without any RL.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from data_prep.demo_kb import MULTI, Question, load_questions
from data_prep.tiny_policy import (
    THINK_GUESS,
    THINK_NEXT_HOP,
    THINK_SEARCH,
    THINK_SEARCH_TWO,
    WarmStartConfig,
    encode_trajectory,
    prompt_ids,
    script_trajectories,
)
from search_r1.evaluate import agent_config, build_agent, score_trajectory
from search_r1.llm_agent.generation import AgentLoop, SearchTrajectory
from verl.config import DEMO_CONFIG
from verl.workers.rollout.base import SamplingParams

FORCE_SEARCH = "<think> Let me"  # the first words of the scripted agent's one-search plan
FORCE_TWO_HOPS = "<think> Two hops"  # ... and of its two-search plan


def rollout(agent: AgentLoop, questions: list[Question], temperature: float = 0.0, seed: int = 0,
            force_search: bool = False, force_chain: bool = False) -> list[SearchTrajectory]:
    """One trajectory per question through the training loop, with the forced decisions asked for."""
    tokenizer = agent.tokenizer
    force_first = tokenizer.encode(FORCE_SEARCH, add_special_tokens=False)
    force_two = tokenizer.encode(FORCE_TWO_HOPS, add_special_tokens=False)

    def prefix(row: int, turn: int, traj: SearchTrajectory) -> list[int]:
        if turn > 0:
            return []
        if force_chain and questions[row].data_source == MULTI:
            return force_two
        return force_first if force_search else []

    params = SamplingParams(max_tokens=agent.data.max_response_length, temperature=temperature, seed=seed)
    prompts = [prompt_ids(tokenizer, q.question) for q in questions]
    return agent.run(prompts, params, turn_prefix=prefix if force_search or force_chain else None).trajectories


def report(name: str, agent: AgentLoop, questions: list[Question], trajs: list[SearchTrajectory],
           normalize: str) -> dict[str, float]:
    """Print and return the figures of one set of rollouts (``questions[i % len(questions)]`` is row i's)."""
    em = [score_trajectory(agent.tokenizer, t, questions[i % len(questions)].answers, normalize)["em"]
          for i, t in enumerate(trajs)]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    by_source = defaultdict(list)
    for i, (t, s) in enumerate(zip(trajs, em, strict=True)):
        by_source[questions[i % len(questions)].data_source].append((s, t.num_searches))
    figures = {"em": mean(em), "search_frac": mean([float(t.num_searches > 0) for t in trajs]),
               "em_searched": mean([s for t, s in zip(trajs, em, strict=True) if t.num_searches > 0]),
               "em_no_search": mean([s for t, s in zip(trajs, em, strict=True) if t.num_searches == 0])}
    for source, pairs in sorted(by_source.items()):
        figures[f"em/{source}"] = mean([s for s, _ in pairs])
        figures[f"searches/{source}"] = mean([float(n) for _, n in pairs])
    print(f"{name:>22}: " + "  ".join(f"{k}={v:.3f}" for k, v in figures.items()))
    return figures


def evaluate(model_dir: str, questions: list[Question], retriever_url: str, samples: int = 0,
             seed: int = 0) -> dict[str, dict[str, float]]:
    """Greedy, forced-search, forced-chain and (``samples`` times) temperature-1 rollouts; prints figures."""
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    cfg = agent_config(model_dir, "hf", retriever_url, seed, files=[str(DEMO_CONFIG)])
    agent = build_agent(cfg, AutoTokenizer.from_pretrained(model_dir))
    normalize = cfg.reward.normalize
    results = {}
    for name, kwargs in [("greedy", {}), ("greedy forced search", {"force_search": True}),
                         ("greedy forced chain", {"force_search": True, "force_chain": True})]:
        start = time.time()
        results[name] = report(name, agent, questions, rollout(agent, questions, **kwargs), normalize)
        print(f"{'':>22}  ({time.time() - start:.1f}s)")
    if samples:
        trajs = [t for k in range(samples) for t in rollout(agent, questions, temperature=1.0, seed=seed + k)]
        results["sampled"] = report(f"T=1.0 x{samples}", agent, questions, trajs, normalize)
    return results


def teacher_forced(model_dir: str, questions: list[Question], retriever_url: str, n: int,
                   seed: int = 0) -> dict[str, float]:
    """Decision probabilities and per-turn NLL of scripted full-chain trajectories (see the module docstring)."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from search_r1.search.client import RetrievalClient

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rng = random.Random(seed)
    picked = rng.sample(questions, min(n, len(questions)))
    client = RetrievalClient(retriever_url, topk=3)
    trajs = script_trajectories(picked, client.search, WarmStartConfig(p_guess=0.0, p_stop_early=0.0,
                                                                       trajectories_per_question=1), rng)
    client.close()
    think = tokenizer.convert_tokens_to_ids("<think>")
    # The decision words: the first token after <think> of each scripted turn.
    first = {name: tokenizer.encode(t.split("<think>")[1], add_special_tokens=False)[0]
             for name, t in [("guess", THINK_GUESS), ("one_search", THINK_SEARCH), ("two_hops", THINK_SEARCH_TWO),
                             ("next_hop", THINK_NEXT_HOP)]}
    decisions, nll = defaultdict(list), defaultdict(list)
    for traj in trajs:
        source = traj.question.data_source
        ids, labels, n_prompt = encode_trajectory(tokenizer, traj, 96)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]  # [T, V]
        logp = logits.log_softmax(-1)
        turns = [i for i in range(n_prompt, len(ids)) if ids[i] == think]  # where each policy turn starts
        for plan in ("guess", "one_search", "two_hops"):
            decisions[f"p_{plan}/{source}"].append(logp[turns[0], first[plan]].exp().item())
        for k, pos in enumerate(turns[1:]):  # after the k+1-th passage block
            decisions[f"p_next_hop{k + 1}/{source}"].append(logp[pos, first["next_hop"]].exp().item())
        ends = turns[1:] + [len(ids)]
        for k, (start, end) in enumerate(zip(turns, ends, strict=True)):
            tokens = [i for i in range(start, end - 1) if labels[i + 1] != -100]
            nll[f"{source}/turn{k + 1}"].append(-logp[tokens, [ids[i + 1] for i in tokens]].mean().item())
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    figures = {k: mean(v) for k, v in sorted(decisions.items())}
    figures.update({f"nll/{k}": mean(v) for k, v in sorted(nll.items())})
    print(f"{'teacher-forced':>22}: " + "  ".join(f"{k}={v:.3f}" for k, v in figures.items()))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="data/demo/tiny_policy")
    parser.add_argument("--data", default="data/demo")
    parser.add_argument("--retriever-url", default="http://127.0.0.1:8000")
    parser.add_argument("--split", default="test")
    parser.add_argument("--samples", type=int, default=4, help="temperature-1.0 rollouts per question")
    parser.add_argument("--teacher-forced", type=int, default=0, metavar="N",
                        help="also score N scripted full-chain trajectories of the split (decisions, NLL per turn)")
    args = parser.parse_args()
    questions = load_questions(args.data, args.split)
    print(f"{len(questions)} {args.split} questions, model {args.model}")
    evaluate(args.model, questions, args.retriever_url, args.samples)
    if args.teacher_forced:
        teacher_forced(args.model, questions, args.retriever_url, args.teacher_forced)


if __name__ == "__main__":
    main()
