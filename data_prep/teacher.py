"""Cold-start trajectories from a teacher model behind an OpenAI-compatible chat server, kept by exact match:
``python -m data_prep.cold_start teacher``.

    python -m data_prep.cold_start teacher --teacher-url http://127.0.0.1:8001/v1 --teacher-model NAME \\
        --data train.parquet --retriever-url URL --out sft.parquet [--n 4 --temperature 0.7] \\
        [--format hermes --tokenizer DIR]

Choices:
- The teacher is asked through the chat API (``openai`` client), as API models and ``vllm serve`` /
  ``transformers serve`` answer it: the question's prompt messages, then one assistant message per teacher turn and
  the messages answering it. A chat API cannot continue a half-written assistant message everywhere, so the teacher
  reads what the loop inserts as messages, while the SFT data hold the trajectory in the student's layout: the
  teacher's turns (sampled) and the inserted blocks, in order, written by ``data_prep.turns`` as the loop writes them
  (``--format``, the RL run's ``multi_turn.format``). The turn rules are the loop's: ``--max-turns`` turns whose
  searches run, then one final turn.
- Tags (``--format search_r1``): a turn stops at ``</search>`` or ``</answer>``; the teacher reads each inserted
  block (the ``<information>`` passages of its search, or the invalid-action feedback) as a user message.
- Tool calls (``--format hermes --tokenizer DIR``): the teacher is offered the search tool through the API's
  ``tools`` (the schema the RL prompt shows) and stops at ``</answer>`` or at its end of turn. Its calls come back as
  the server's ``tool_calls`` (OpenAI, vLLM with a tool parser) or as ``<tool_call>`` text in the content (a server
  without a parser); either way the student's turn is the content, each call as ``<tool_call>{"name",
  "arguments"}</tool_call>`` and the template's end-of-turn token. The calls are checked and run as the loop runs
  them (``hermes.check_calls``, ``search_r1.tools.SearchTool``, the loop's default ``max_parallel_calls``; a malformed
  call gets its error message); the teacher reads each result as a tool message answering its call. The prompts are
  used as they are, as ``rft`` does: make them with ``data_prep.qa_search --format hermes`` or
  ``data_prep.retemplate``.
- Servers differ in whether the returned text keeps the stop string (OpenAI's API drops it, ``transformers serve``
  keeps it): a turn that stopped with an open tag gets its closing tag back, then the format's parser
  (``tags.parse_action``, ``hermes.parse_turn``) reads it as the loop does.
- Rejection: a trajectory is kept when it answered with an exact match of a gold answer (``qa_em.em_check``, the
  reward's check); identical kept trajectories of one question are kept once. ``--n`` samples per question, each
  with its own seed, ``--concurrency`` requests at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from data_prep.sft_rows import gold_answers, qa_fields, sft_row
from data_prep.turns import HermesTurns, TagTurns
from search_r1.llm_agent.formatting import policy_turn
from search_r1.llm_agent.hermes import HERMES_FEEDBACK, check_calls, error_message, parse_turn, run_calls
from search_r1.llm_agent.tags import STOP_STRINGS, parse_action
from search_r1.reward.qa_em import em_check, extract_answer
from search_r1.tools import DEFAULT_TOOLS, ToolEnv
from verl.agent.trajectory import ActionKind
from verl.config import MultiTurnConfig
from verl.tools import ToolCallError, build_tools
from verl.utils.dataset import read_rows
from verl.utils.progress import progress


@dataclass
class Reply:
    """One answer of the teacher's chat server."""

    text: str  # the message's content
    finish_reason: str  # stop | length | tool_calls
    tool_calls: list[dict] = field(default_factory=list)  # calls the server parsed: {"id", "name", "arguments": JSON}


ChatFn = Callable[[list[dict], int], Reply]  # (messages, seed) -> the teacher's reply
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


def closed(text: str, finish_reason: str, stops: list[str] = STOP_STRINGS) -> tuple[str, str | None]:
    """A turn's text ending with its stop string (one of ``stops``, each ``</tag>``), and that stop string (None: the
    turn ended otherwise)."""
    ends = [(text.find(stop), stop) for stop in stops if stop in text]
    if ends:
        end, stop = min(ends)
        return text[:end + len(stop)], stop
    opened = max((text.rfind(f"<{stop[2:-1]}>"), stop[2:-1]) for stop in stops)
    if finish_reason == "stop" and opened[0] >= 0:
        return f"{text}</{opened[1]}>", f"</{opened[1]}>"
    return text, None


@dataclass
class TeacherTurn:
    """One teacher turn, read as the loop reads the policy's."""

    kind: ActionKind
    content: Any  # ACT: the query (tags) or the turn's calls (hermes)
    turn: dict  # the turn in the student's layout (sampled)
    message: dict  # the assistant message the teacher's conversation goes on with


class TagTeacher:
    """The tag format: the teacher reads each inserted block as a user message."""

    def __init__(self, write: TagTurns, search: SearchFn) -> None:
        self.write, self.search = write, search

    def read(self, reply: Reply) -> TeacherTurn:
        text, stop = closed(reply.text, reply.finish_reason, self.write.stop)
        kind, content = parse_action(text, "length" if reply.finish_reason == "length" else "stop", stop, cut=False)
        return TeacherTurn(kind, content, policy_turn(text), {"role": "assistant", "content": text})

    def respond(self, turn: TeacherTurn) -> tuple[dict, list[dict]]:
        """What the loop inserts after ``turn`` (a search or an invalid action), and the messages the teacher reads."""
        inserted = self.write.passages(self.search([turn.content])[0]) if turn.kind is ActionKind.ACT \
            else self.write.feedback()
        return inserted, [{"role": "user", "content": inserted["text"]}]


class HermesTeacher:
    """The hermes format: the teacher calls the search tool, and reads each call's result as a tool message."""

    def __init__(self, write: HermesTurns, search: SearchFn) -> None:
        async def retrieve(queries: list[str]) -> list[list[dict]]:
            return search(queries)

        self.write = write
        self.tools = build_tools(DEFAULT_TOOLS, ToolEnv(retrieve=retrieve, client=None, do_search=True))

    def read(self, reply: Reply) -> TeacherTurn:
        calls = "".join(self.write.call(c["name"], _json_or_text(c["arguments"])) for c in reply.tool_calls)
        text, stop = closed(reply.text + calls, reply.finish_reason, self.write.stop)
        kind, content = parse_turn(text, "length" if reply.finish_reason == "length" else "stop", stop, cut=False)
        message = {"role": "assistant", "content": text}
        if reply.tool_calls:  # the server's own record of the calls, which its template renders
            message = {"role": "assistant", "content": reply.text, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in reply.tool_calls]}
        ended = kind in (ActionKind.ACT, ActionKind.EOS)  # at the end-of-turn token, not a stop string or a cut
        return TeacherTurn(kind, content, self.write.ended(text) if ended else policy_turn(text), message)

    def respond(self, turn: TeacherTurn) -> tuple[dict, list[dict]]:
        """What the loop inserts after ``turn`` (tool calls or an invalid turn), and the messages the teacher reads."""
        if turn.kind is not ActionKind.ACT:
            return self.write.feedback(), [{"role": "user", "content": HERMES_FEEDBACK}]
        calls = turn.content
        check_calls(calls, self.tools, MultiTurnConfig.max_parallel_calls)  # the loop's default
        good = [c for c in calls if c.error is None]
        results = iter(asyncio.run(run_calls(self.tools, good)) if good else [])
        texts = [error_message(c.error) if c.error is not None else _result_text(next(results)) for c in calls]
        known = [c["id"] for c in turn.message.get("tool_calls", [])]  # calls written as text get ids here
        ids = [f"call_{i}" for i in range(len(calls) - len(known))] + known
        return self.write.results(texts), [{"role": "tool", "tool_call_id": call_id, "content": text}
                                           for call_id, text in zip(ids, texts, strict=True)]


def _json_or_text(arguments: str) -> Any:
    """A structured call's arguments (JSON text) as the policy would write them: the object, or the text as it came
    when it is not JSON (the call is then malformed, as the policy's would be)."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _result_text(result: str | ToolCallError) -> str:
    return error_message(str(result)) if isinstance(result, ToolCallError) else result


def teacher_actions(write: TagTurns, search: SearchFn) -> TagTeacher | HermesTeacher:
    return HermesTeacher(write, search) if isinstance(write, HermesTurns) else TagTeacher(write, search)


def teacher_trajectory(chat: ChatFn, prompt: list[dict], actions: TagTeacher | HermesTeacher, max_turns: int,
                       seed: int) -> tuple[list[dict], str]:
    """One trajectory of the teacher -> (turns in the student's layout, how it ended: a ``StopReason`` value)."""
    messages, turns = [dict(m) for m in prompt], []
    for turn in range(max_turns + 1):
        read = actions.read(chat(messages, seed))
        turns.append(read.turn)
        messages.append(read.message)
        if read.kind is ActionKind.ANSWER:
            return turns, "answered"
        if read.kind is ActionKind.EOS:
            return turns, "eos_without_answer"
        if turn == max_turns:
            return turns, "max_turns"
        inserted, said = actions.respond(read)
        turns.append(inserted)
        messages.extend(said)
    raise AssertionError("unreachable: the last turn returns")


def openai_chat(args: argparse.Namespace, write: TagTurns) -> ChatFn:
    """The teacher's server, asked with ``write``'s stop strings and tools."""
    from openai import OpenAI

    client = OpenAI(base_url=args.teacher_url, api_key=args.api_key, max_retries=2)
    tools = {"tools": write.tools} if write.tools else {}

    def chat(messages: list[dict], seed: int) -> Reply:
        reply = client.chat.completions.create(model=args.teacher_model, messages=messages, stop=write.stop,
                                               max_tokens=args.max_tokens, temperature=args.temperature, seed=seed,
                                               **tools)
        choice = reply.choices[0]
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in choice.message.tool_calls or [] if c.type == "function"]
        return Reply(choice.message.content or "", choice.finish_reason or "stop", calls)

    return chat


def teacher_cold_start(args: argparse.Namespace, chat: ChatFn, search: SearchFn,
                       write: TagTurns) -> tuple[list[dict], Counter]:
    """SFT rows of the teacher's exact-match trajectories over ``args.data`` in ``write``'s format -> (rows kept,
    outcome counts)."""
    if args.n < 1 or args.max_turns < 0 or args.concurrency < 1:
        raise ValueError(f"--n and --concurrency must be >= 1 and --max-turns >= 0, got {args.n}, {args.concurrency} "
                         f"and {args.max_turns}")
    rows = read_rows(args.data, required=("prompt", "reward_model"))
    items = [(row, sample) for row in range(len(rows)) for sample in range(args.n)]
    actions = teacher_actions(write, search)

    def one(item: tuple[int, int]) -> tuple[list[dict], str]:
        row, sample = item
        return teacher_trajectory(chat, list(rows[row]["prompt"]), actions, args.max_turns,
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
    kept_rows = [sft_row(qa_fields(rows[row], row), turns, write.tools) for row in sorted(kept) for turns in kept[row]]
    return kept_rows, counts
