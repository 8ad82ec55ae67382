"""The tiny demo policy: tokenizer + small Qwen2 model + a short supervised warm start on scripted trajectories.

``python -m data_prep.tiny_policy --data data/demo --out data/demo/tiny_policy --retriever-url URL`` needs the
demo knowledge base (``data_prep.demo_kb``) and the retrieval service running over its corpus.

Choices:

- Trajectories are written by an IMPERFECT scripted agent and trained by the supervised cold start every user's
  model takes (``verl.trainer.main_sft``; ``data_prep/warm_start_sft.py`` writes them as SFT rows): the
  chat-templated prompt, then policy turns ``<think> ... </think><search> q </search>`` /
  ``<think> ... </think><answer> a </answer>``, each tokenised on its own, and after each search the REAL passages
  of the retrieval service as the loop inserts them (``search_r1.llm_agent.formatting.observation_ids``: the whole
  block, or passages cut to fit). The loss is on policy tokens only (inserted blocks and the prompt are masked).
  ``encode_trajectory`` gives the same tokens (plus an EOS after the answer) for the benchmarks.
- The scripted agent searches correctly only part of the time: with ``p_guess`` it answers at once with a wrong
  entity of the right kind (from another training question), and on two-hop questions with ``p_stop_early`` it
  searches once and answers with the intermediate entity. When it searches it copies the entity name into the
  query and restates the fact it read (``Found it: X was founded by Y.`` / ``One more hop: ...``) before
  answering or searching the next entity, so the policy learns to copy the answer span out of the passages.
- One decision, at the start, as the first word of the first ``<think>``: ``I`` (guess), ``Let`` (one search:
  ``Let me search for X.``) or ``Two`` (``Two hops, first X.``); RL has one token to move, right after the
  question that should decide it. Everything after follows the plan deterministically: after a passage block
  ``One more hop`` if the plan was two hops and this is the first block, else ``Found it``. A decision there
  would have to look back past the passages to the question; the tiny model learned that only for some seeds
  (with the decision after the first block, one seed's policy never took the second hop, so RL could not teach
  it), while looking back to its own plan word it learns for every seed tried (``benchmarks/eval_warm_start.py
  --teacher-forced`` measures it; measured figures: docs/history/results-journal.md, "Warm-start history").
- The tag follows ``</think>`` directly (no newline): the ``</think>`` token then attends to the turn's first
  word itself. With a newline in between, the tag was predicted from the newline, and for some seeds it ignored
  the turn (``<answer>`` after ``Let me search for X.``).
- The scripted agent rarely stops early (``p_stop_early`` 0.1), so that on two-hop questions the warm start plans
  two hops far more often than one search. With 0.4 the learned plan on two-hop questions was one search as
  often as two hops or more, and PPO, which one search rewards on one-hop questions, moved every question to one
  search: no second hop after training, for 2 and 3 layers. With 0.1 two hops is the likelier plan on two-hop
  questions and one search on one-hop ones, and PPO learns the second hop for every seed tried.
- With ``p_guess`` 0.7 the plan is most often a guess, so the greedy warm-started policy guesses on two-hop
  questions and on some one-hop ones (low test EM before RL), and its sampled rollouts search often enough, and
  are right often enough when they do, for RL to learn to search on every question and twice on two-hop ones.
- Copying first: a model this small rarely discovers, from the few copied tokens of the trajectories, how to
  copy an unseen name out of its context (long warm starts without it left test EM near 0 even with the search
  forced). So the warm start begins with a copy task (random token sequences repeated once, loss on the
  repeat; the tiny model's stand-in for what a pretrained model brings) that runs until its loss is below 0.2 (the
  copying circuit has formed), and keeps a few rows of it in every trajectory step: ``main_sft``'s second objective
  (``data.mix_files``), copy rows placed after the instruction, inside the prompt, where no policy turn is. Without
  them the skill faded during SFT and the policy misread names; as rows of the SFT data the policy learnt to write
  them (docs/results.md, "The demo's warm start through main_sft").
- Measured figures behind these choices (plan probabilities, EM per seed, steps): docs/results.md.
- Sizes: vocabulary 2048 (BPE on corpus, prompts and trajectories), Qwen2 with hidden 64 x ``num_heads`` (vLLM's
  CPU attention needs head_dim 64), ``num_layers`` layers; AdamW with linear warmup and cosine decay; steps of
  similar-length trajectories up to a token budget (``data.train_batch_tokens``), every policy token weighted the
  same; seeded.
- Pinned numerics: the command runs under ``configs/demo_numerics.env`` (it re-executes itself with those variables
  if they are not set), so the same seed gives the same policy, bit for bit, on any AVX2 machine and with any
  thread count; ``make demo`` and ``benchmarks/ablations.py`` run the trainer under the same variables.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from data_prep import warm_start_sft
from data_prep.demo_kb import Question, load_questions
from data_prep.tiny_model import TAG_TOKENS, build_model, train_tokenizer
from search_r1.llm_agent import formatting
from search_r1.llm_agent.formatting import INFO_CLOSE, INFO_OPEN, format_passages
from search_r1.prompts import make_prompt
from verl.utils.progress import progress
from verl.utils.tokenizer import render_prompt

logger = logging.getLogger(__name__)

SearchFn = Callable[[list[str]], list[list[dict]]]  # queries -> per query, docs {"id", "contents"}
SEARCH_BATCH = 1024  # queries per retrieval request (the service's default --max-queries)
IGNORE = -100  # label of tokens without loss (prompt, inserted blocks, padding)

# The scripted turns. The first word of the first <think> is the plan (Let = one search, Two = two hops, I = guess);
# the first words of the later ones follow from it (One = the second hop, Found = answer).
THINK_SEARCH = "<think> Let me search for {q}. </think><search> {q} </search>"
THINK_SEARCH_TWO = "<think> Two hops, first {q}. </think><search> {q} </search>"
THINK_GUESS = "<think> I already know this. </think><answer> {a} </answer>"
THINK_NEXT_HOP = "<think> One more hop: {fact} </think><search> {q} </search>"
THINK_ANSWER = "<think> Found it: {fact} </think><answer> {a} </answer>"


@dataclass
class WarmStartConfig:
    """Knobs of the scripted agent, the model and the supervised warm start."""

    p_guess: float = 0.7  # answer at once with a wrong guess (the greedy warm-started policy mostly guesses)
    p_stop_early: float = 0.1  # two-hop: plan one search and answer with the intermediate entity (rare, so
    # that two hops is the likelier search plan on two-hop questions; see the module docstring)
    trajectories_per_question: int = 2
    vocab_size: int = 2048
    num_layers: int = 2
    num_heads: int = 2  # hidden size = 64 x heads
    intermediate_size: int = 512
    copy_steps: int = 1500  # at most this many steps (64 rows each) of the repeated-random-sequence task before the
    # trajectories (copy_task_batch)
    copy_stop_loss: float = 0.2  # it stops earlier once its mean loss over 20 steps is below this (the copying
    # circuit has formed)
    copy_rows: int = 8  # copy rows mixed into every trajectory step (data.mix_files; warm_start_sft.copy_text_rows)
    copy_source: str = "tokens"  # the copy rows' sequences: tokens (random vocabulary tokens, as the copy task) | words
    copy_length: int = 24  # maximum length of the random sequence that is repeated
    steps: int = 2500  # trajectory steps; 1500 left the plan on two-hop questions weakly learnt, and whether PPO
    # then found the second hop depended on the machine's last bits (measured figures: docs/results.md)
    tokens_per_batch: int = 2400  # padded tokens per optimiser step, counted after the instruction all rows share
    # (data.train_batch_tokens is this scaled to whole rows: data_prep/warm_start_sft.py)
    lr: float = 2e-3
    warmup_ratio: float = 0.05
    max_obs_length: int = 96  # tokens of one inserted block, tags included (data.max_obs_length)
    seed: int = 0
    threads: int | None = None  # torch threads (None: torch's default, OMP_NUM_THREADS or the cores); under the
    # pinned numerics the result does not depend on it


@dataclass
class Segment:
    """A piece of a scripted response: policy text (trained) or retrieved docs (inserted, context only)."""

    text: str = ""
    docs: list[dict] | None = None
    eos: bool = False  # policy text followed by the eos token (the final answer)


@dataclass
class ScriptedTrajectory:
    question: Question
    segments: list[Segment]


def search_unique(search: SearchFn, queries: list[str], max_queries: int = SEARCH_BATCH) -> list[list[dict]]:
    """Docs per query: each distinct query is searched once, in requests of at most ``max_queries``."""
    unique = list(dict.fromkeys(queries))
    found: dict[str, list[dict]] = {}
    for start in range(0, len(unique), max_queries):
        part = unique[start:start + max_queries]
        results = search(part)
        if len(results) != len(part):
            raise RuntimeError(f"search returned {len(results)} results for {len(part)} queries")
        found.update(zip(part, results, strict=True))
    return [found[q] for q in queries]


def script_trajectories(questions: list[Question], search: SearchFn, cfg: WarmStartConfig,
                        rng: random.Random) -> list[ScriptedTrajectory]:
    """``trajectories_per_question`` scripted trajectories per question; the searches of one turn are batched."""
    guesses: dict[str, list[str]] = {}
    for q in questions:
        guesses.setdefault(q.answer_kind, []).append(q.answers[0])
    plans = []  # (question, hops to search: 0 = guess, 1..len(chain))
    for q in questions:
        for _ in range(cfg.trajectories_per_question):
            if rng.random() < cfg.p_guess:
                plans.append((q, 0))
            elif len(q.chain) > 1 and rng.random() < cfg.p_stop_early:
                plans.append((q, 1))
            else:
                plans.append((q, len(q.chain)))
    docs_per_plan: list[list[list[dict]]] = [[] for _ in plans]
    for turn in range(max(n for _, n in plans)):
        idx = [i for i, (_, n) in enumerate(plans) if n > turn]
        results = search_unique(search, [plans[i][0].chain[turn].query for i in idx])
        for i, docs in zip(idx, results, strict=True):
            docs_per_plan[i].append(docs)
    out = []
    for (q, n_hops), docs_per_hop in zip(plans, docs_per_plan, strict=True):
        if n_hops == 0:
            wrong = [a for a in guesses[q.answer_kind] if a not in q.answers]
            segments = [Segment(THINK_GUESS.format(a=rng.choice(wrong)), eos=True)]
        else:
            plan = THINK_SEARCH if n_hops == 1 else THINK_SEARCH_TWO
            segments = [Segment(plan.format(q=q.chain[0].query)), Segment(docs=docs_per_hop[0])]
            for hop in range(1, n_hops):
                fact = q.chain[hop - 1].statement
                segments += [Segment(THINK_NEXT_HOP.format(fact=fact, q=q.chain[hop].query)),
                             Segment(docs=docs_per_hop[hop])]
            last = q.chain[n_hops - 1]
            segments.append(Segment(THINK_ANSWER.format(fact=last.statement, a=last.answer), eos=True))
        out.append(ScriptedTrajectory(q, segments))
    return out


def prompt_ids(tokenizer: PreTrainedTokenizerFast, question: str) -> list[int]:
    """Token ids of the prompt, as the dataset builds them."""
    return render_prompt(tokenizer, [{"role": "user", "content": make_prompt(question)}])


def observation_ids(tokenizer: PreTrainedTokenizerFast, docs: list[dict], max_obs_length: int) -> list[int]:
    """The inserted block exactly as the agent loop builds it (``formatting.observation_ids``)."""
    return formatting.observation_ids(tokenizer, [docs], max_obs_length)[0][0]


def encode_trajectory(tokenizer: PreTrainedTokenizerFast, traj: ScriptedTrajectory,
                      max_obs_length: int) -> tuple[list[int], list[int], int]:
    """(input ids [T], labels [T] with IGNORE off the policy's tokens, number of prompt tokens)."""
    ids = prompt_ids(tokenizer, traj.question.question)
    n_prompt = len(ids)
    labels = [IGNORE] * n_prompt
    for seg in traj.segments:
        if seg.docs is not None:
            obs = observation_ids(tokenizer, seg.docs, max_obs_length)
            ids += obs
            labels += [IGNORE] * len(obs)
        else:
            part = tokenizer.encode(seg.text, add_special_tokens=False)
            if seg.eos:
                part.append(tokenizer.eos_token_id)
            ids += part
            labels += part
    return ids, labels, n_prompt


def trajectory_texts(trajs: list[ScriptedTrajectory]) -> list[str]:
    """Plain text of each trajectory's response (tokenizer training data)."""
    return ["".join(seg.text if seg.docs is None else INFO_OPEN + format_passages(seg.docs) + INFO_CLOSE
                    for seg in t.segments) for t in trajs]


def shared_prefix_length(examples: list[tuple[list[int], list[int]]]) -> int:
    """Length of the token prefix all examples share (the instruction), ending before any labelled token's
    predecessor, so that no label is predicted from inside the prefix."""
    first_labelled = min(next(i for i, label in enumerate(labels) if label != IGNORE) for _, labels in examples)
    return len(os.path.commonprefix([ids[:first_labelled - 1] for ids, _ in examples]))


def _collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids / labels / attention_mask [B, T]."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(examples):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, :len(lab)] = torch.tensor(lab)
        attention[i, :len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def batch_loss(model: Qwen2ForCausalLM, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over the labelled tokens of ``batch`` ([B, T] right-padded ``input_ids``, ``labels``,
    ``attention_mask``); the output layer runs only at the positions that predict a labelled token."""
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    targets = batch["labels"][:, 1:]  # [B, T-1]: the token each position predicts
    predicting = targets != IGNORE
    logits = model.lm_head(hidden[:, :-1][predicting])  # [N, V], N labelled tokens
    return torch.nn.functional.cross_entropy(logits, targets[predicting])


def copy_task_batch(token_ids: Sequence[int], rows: int, max_length: int, rng: random.Random,
                    pad_id: int) -> dict[str, torch.Tensor]:
    """``rows`` sequences ``A A`` of random tokens, loss on the second ``A`` after its first token: [B, T].

    Predicting a repeat of a random sequence is possible only by copying (find the earlier occurrence of the
    current token, emit what followed it), the skill the policy needs to restate a passage's fact and answer
    with a name it has never seen. Mixed into the warm start, this task makes the copying circuit form in a
    few hundred steps instead of being discovered slowly from the trajectories' few copied tokens.
    """
    examples = []
    for _ in range(rows):
        seq = [rng.choice(token_ids) for _ in range(rng.randint(max(2, max_length // 3), max_length))]
        examples.append((seq + seq, [IGNORE] * (len(seq) + 1) + seq[1:]))
    return _collate(examples, pad_id)


def _optimise(model: Qwen2ForCausalLM, steps: int, lr: float, warmup_ratio: float, loss_fn: Callable[[], torch.Tensor],
              desc: str, decay: bool = True, stop_below: float | None = None) -> list[float]:
    """At most ``steps`` AdamW steps on ``loss_fn()`` with linear warmup, then cosine decay to 10 % (or a constant
    rate with ``decay=False``); stops early once the mean loss of the last 20 steps is below ``stop_below``.
    Returns the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, int(warmup_ratio * steps))

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if not decay:
            return 1.0
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    losses: list[float] = []
    model.train()
    bar = progress(range(steps), desc=desc, unit="step")
    for _ in bar:
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        recent = sum(losses[-20:]) / len(losses[-20:])
        bar.set_postfix(loss=f"{recent:.3f}")
        if stop_below is not None and len(losses) >= 20 and recent < stop_below:
            break
    model.eval()
    return losses


def pretrain_copy(model: Qwen2ForCausalLM, pad_id: int, cfg: WarmStartConfig, rng: random.Random,
                  copy_tokens: Sequence[int]) -> None:
    """At most ``cfg.copy_steps`` steps of the copy task alone (64 rows each), until its loss is below
    ``cfg.copy_stop_loss``: the copying skill a pretrained model brings (``copy_task_batch``), formed well enough to
    outlast the SFT that follows."""
    if cfg.copy_steps and copy_tokens:
        copy_losses = _optimise(model, cfg.copy_steps, cfg.lr, 0.05, lambda: batch_loss(
            model, copy_task_batch(copy_tokens, 64, cfg.copy_length, rng, pad_id)), "copy task", decay=False,
            stop_below=cfg.copy_stop_loss)
        logger.info("copy task: loss %.3f after %d steps", sum(copy_losses[-20:]) / len(copy_losses[-20:]),
                    len(copy_losses))


def build_tiny_policy(data_dir: str | Path, out_dir: str | Path, search: SearchFn,
                      cfg: WarmStartConfig) -> dict[str, float]:
    """Script trajectories, train the tokenizer, build and warm-start the model, save it to ``out_dir``.

    Returns figures of the run (trajectory counts, token counts, final loss, seconds).
    """
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    start = time.time()
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    questions = load_questions(data_dir, "train")
    trajs = script_trajectories(questions, search, cfg, rng)
    logger.info("scripted %d trajectories for %d questions in %.1fs", len(trajs), len(questions), time.time() - start)
    with (data_dir / "corpus.jsonl").open() as f:
        corpus = [json.loads(line)["contents"] for line in f]
    texts = corpus + [make_prompt(q.question) for q in questions] + trajectory_texts(trajs)
    tokenizer = train_tokenizer(texts, cfg.vocab_size)
    encoded = [encode_trajectory(tokenizer, t, cfg.max_obs_length) for t in trajs]
    examples = [(ids, labels) for ids, labels, _ in encoded]
    model = build_model(tokenizer, hidden_size=64 * cfg.num_heads, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                        intermediate_size=cfg.intermediate_size, seed=cfg.seed)
    train_start = time.time()
    special = set(tokenizer.all_special_ids) | set(tokenizer.convert_tokens_to_ids(TAG_TOKENS))
    copy_tokens = [i for i in range(len(tokenizer)) if i not in special]
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    pretrain_copy(model, tokenizer.pad_token_id, cfg, rng, copy_tokens)
    losses = warm_start_sft.run(model, tokenizer, trajs, [len(ids) for ids, _ in examples],
                                examples[0][0][:shared_prefix_length(examples)], cfg, out_dir)
    train_seconds = time.time() - train_start
    figures = {
        "trajectories": len(trajs),
        "guess_fraction": sum(len(t.segments) == 1 for t in trajs) / len(trajs),
        "mean_tokens": sum(len(ids) for ids, _ in examples) / len(examples),
        "max_prompt_tokens": max(n for _, _, n in encoded),
        "max_response_tokens": max(len(ids) - n for ids, _, n in encoded),
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "train_seconds": train_seconds,
        "total_seconds": time.time() - start,
    }
    (out_dir / "warm_start.json").write_text(json.dumps({"config": vars(cfg), "figures": figures}, indent=1))
    return figures


def demo_numerics_env() -> dict[str, str]:
    """The variables of ``configs/demo_numerics.env`` (its ``export KEY=VALUE`` lines) that pin the demo's CPU
    numerics; the checkout's file, else the copy an installed wheel ships in ``verl.configs``."""
    path = Path(__file__).resolve().parent.parent / "configs" / "demo_numerics.env"
    if not path.is_file():
        path = Path(str(importlib.resources.files("verl.configs"))) / "demo_numerics.env"
    env = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key.strip()] = value.strip()
    return env


def run_pinned() -> None:
    """Re-execute this command (``python -m data_prep.tiny_policy ARGS``) under the pinned numerics
    (``demo_numerics_env``) unless they are already set: MKL and ATen read them once, when they load."""
    pinned = demo_numerics_env()
    if any(os.environ.get(k) != v for k, v in pinned.items()):
        os.execve(sys.executable, [sys.executable, "-m", "data_prep.tiny_policy", *sys.argv[1:]],
                  {**os.environ, **pinned})


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (run as a command, it first re-executes itself under the pinned numerics: ``run_pinned``)."""
    defaults = WarmStartConfig()
    parser = argparse.ArgumentParser(prog="python -m data_prep.tiny_policy", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="demo data directory (data_prep.demo_kb --out)")
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument("--retriever-url", required=True, help="base URL of the retrieval service over the corpus")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimiser steps of the warm start")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--num-layers", type=int, default=defaults.num_layers)
    parser.add_argument("--num-heads", type=int, default=defaults.num_heads, help="hidden size = 64 x heads")
    parser.add_argument("--copy-steps", type=int, default=defaults.copy_steps,
                        help="at most this many steps of the copy task before the trajectories")
    parser.add_argument("--copy-stop-loss", type=float, default=defaults.copy_stop_loss,
                        help="the copy task stops once its loss is below this")
    parser.add_argument("--copy-rows", type=int, default=defaults.copy_rows,
                        help="copy rows mixed into every SFT step (the instruction, a random sequence, then its "
                             "repeat, trained)")
    parser.add_argument("--copy-source", choices=("tokens", "words"), default=defaults.copy_source,
                        help="the copy rows' sequences: random vocabulary tokens or the passages' words")
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help="torch threads (default: torch's own; the result does not depend on it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from search_r1.search.client import RetrievalClient

    client = RetrievalClient(args.retriever_url, topk=3)
    cfg = WarmStartConfig(steps=args.steps, seed=args.seed, num_layers=args.num_layers, num_heads=args.num_heads,
                          copy_steps=args.copy_steps, copy_stop_loss=args.copy_stop_loss, copy_rows=args.copy_rows,
                          copy_source=args.copy_source, threads=args.threads)
    figures = build_tiny_policy(args.data, args.out, client.search, cfg)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    run_pinned()
    raise SystemExit(main())
