"""Cold-start trajectories from a teacher model behind an OpenAI-compatible chat server, kept by exact match:
``python -m data_prep.cold_start teacher``.

    python -m data_prep.cold_start teacher --teacher-url http://127.0.0.1:8001/v1 --teacher-model NAME \\
        --data train.parquet --retriever-url URL --out sft.parquet [--n 4 --temperature 0.7]

Choices:
- The teacher is asked through the chat API (``openai`` client), as API models and ``vllm serve`` /
  ``transformers serve`` answer it: the question's prompt messages, then one assistant message per teacher turn and
  one user message per block the loop inserts (the ``<information>`` passages of its search, or the invalid-action
  feedback). A chat API cannot continue a half-written assistant message everywhere, so the teacher sees the blocks
  as user turns, while the SFT data hold the trajectory in the student's layout: the teacher's turns (sampled) and
  the inserted blocks, in order (``data_prep.sft_rows``).
- A turn stops at ``</search>`` or ``</answer>`` (``stop``). Servers differ in whether the returned text keeps the
  stop string (OpenAI's API drops it, ``transformers serve`` keeps it): a turn that stopped with an open
  ``<search>`` or ``<answer>`` gets its closing tag back, then ``generation.parse_action`` reads it as the loop
  does. The turn rules are the loop's: ``--max-turns`` turns whose searches run, then one final turn.
- Rejection: a trajectory is kept when it answered with an exact match of a gold answer (``qa_em.em_check``, the
  reward's check); identical kept trajectories of one question are kept once. ``--n`` samples per question, each
  with its own seed, ``--concurrency`` requests at a time.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from data_prep.sft_rows import gold_answers, qa_fields, sft_row
from search_r1.llm_agent.formatting import feedback_turn, information_turn, policy_turn
from search_r1.llm_agent.generation import STOP_STRINGS, ActionKind, parse_action
from search_r1.reward.qa_em import em_check, extract_answer
from verl.utils.dataset import read_rows
from verl.utils.progress import progress

ChatFn = Callable[[list[dict], int], tuple[str, str]]  # (messages, seed) -> (text, finish_reason)
SearchFn = Callable[[list[str]], list[list[dict]]]


def add_teacher_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--teacher-url", required=True, help="the server's OpenAI API base, e.g. http://HOST:PORT/v1")
    parser.add_argument("--teacher-model", required=True, help="the model name the server serves")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"),
                        help="API key (default: $OPENAI_API_KEY, else none)")
    parser.add_argument("--n", type=int, default=4, help="samples per question")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-turns", type=int, default=4, help="turns whose searches run (then one final turn)")
    parser.add_argument("--max-tokens", type=int, default=500, help="tokens of one teacher turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=8, help="requests to the teacher at a time")


def closed(text: str, finish_reason: str) -> tuple[str, str | None]:
    """A turn's text ending with its stop string, and that stop string (None: the turn ended otherwise)."""
    ends = [(text.find(stop), stop) for stop in STOP_STRINGS if stop in text]
    if ends:
        end, stop = min(ends)
        return text[:end + len(stop)], stop
    opened = max((text.rfind(f"<{tag}>"), tag) for tag in ("search", "answer"))
    if finish_reason == "stop" and opened[0] >= 0:
        return f"{text}</{opened[1]}>", f"</{opened[1]}>"
    return text, None


def teacher_trajectory(chat: ChatFn, prompt: list[dict], search: SearchFn, max_turns: int,
                       seed: int) -> tuple[list[dict], str]:
    """One trajectory of the teacher -> (turns in the student's layout, how it ended: a ``StopReason`` value)."""
    messages, turns = [dict(m) for m in prompt], []
    for turn in range(max_turns + 1):
        text, finish = chat(messages, seed)
        text, stop = closed(text, finish)
        kind, content = parse_action(text, "length" if finish == "length" else "stop", stop, cut=False)
        turns.append(policy_turn(text))
        messages.append({"role": "assistant", "content": text})
        if kind is ActionKind.ANSWER:
            return turns, "answered"
        if kind is ActionKind.EOS:
            return turns, "eos_without_answer"
        if turn == max_turns:
            return turns, "max_turns"
        inserted = information_turn(search([content])[0]) if kind is ActionKind.SEARCH else feedback_turn()
        turns.append(inserted)
        messages.append({"role": "user", "content": inserted["text"]})
    raise AssertionError("unreachable: the last turn returns")


def openai_chat(args: argparse.Namespace) -> ChatFn:
    from openai import OpenAI

    client = OpenAI(base_url=args.teacher_url, api_key=args.api_key, max_retries=2)

    def chat(messages: list[dict], seed: int) -> tuple[str, str]:
        reply = client.chat.completions.create(model=args.teacher_model, messages=messages, stop=STOP_STRINGS,
                                               max_tokens=args.max_tokens, temperature=args.temperature, seed=seed)
        choice = reply.choices[0]
        return choice.message.content or "", choice.finish_reason or "stop"

    return chat


def teacher_cold_start(args: argparse.Namespace, chat: ChatFn, search: SearchFn) -> tuple[list[dict], Counter]:
    """SFT rows of the teacher's exact-match trajectories over ``args.data`` -> (rows kept, outcome counts)."""
    if args.n < 1 or args.max_turns < 0 or args.concurrency < 1:
        raise ValueError(f"--n and --concurrency must be >= 1 and --max-turns >= 0, got {args.n}, {args.concurrency} "
                         f"and {args.max_turns}")
    rows = read_rows(args.data, required=("prompt", "reward_model"))
    items = [(row, sample) for row in range(len(rows)) for sample in range(args.n)]

    def one(item: tuple[int, int]) -> tuple[list[dict], str]:
        row, sample = item
        return teacher_trajectory(chat, list(rows[row]["prompt"]), search, args.max_turns,
                                  args.seed + row * args.n + sample)

    counts: Counter = Counter()
    kept: dict[int, list[list[dict]]] = {}
    with ThreadPoolExecutor(args.concurrency) as pool, progress(total=len(items), unit="traj", desc="teacher") as bar:
        for (row, _), (turns, ended) in zip(items, pool.map(one, items), strict=True):
            answer = extract_answer("".join(t["text"] for t in turns if t["sampled"]))
            outcome = f"not answered ({ended})" if ended != "answered" else \
                "exact_match" if answer is not None and em_check(answer, gold_answers(rows[row])) else "wrong answer"
            if outcome == "exact_match" and turns in kept.get(row, []):
                outcome = "duplicate"
            if outcome == "exact_match":
                kept.setdefault(row, []).append(turns)
            counts[outcome] += 1
            bar.update()
    return [sft_row(qa_fields(rows[row], row), turns) for row in sorted(kept) for turns in kept[row]], counts
