"""The hermes action format of the search task (``multi_turn.format=hermes``): tool calls in the model's own chat
template, token-in/token-out, in the agent loop (``verl.agent.loop``).

The policy sees its tools as JSON schemas in the prompt (``render_prompt(..., tools=...)``), calls them by writing
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (several per turn allowed) and ends its turn with the
template's end-of-turn token; each call's result comes back as a ``tool`` message rendered by the chat template
(the convention Hermes and Qwen2.5/Qwen3 instruct models were tuned on, as in verl's and SkyRL's agent loops). The
answer is still ``<answer> ... </answer>`` in the final assistant message, so rewards and EM are the tag format's.

Choices:

- Token-in/token-out. The history is never re-tokenised: after a turn, the loop appends only the ids of what the
  template writes after the assistant's content (the rest of its closing after the sampled end-of-turn token),
  the tool messages and the next generation prompt. Those are computed by the usual delta: render a fixed stand-in
  conversation ending in an assistant message, with and without the new messages (``ChatFormat.insertion``), and
  tokenise the difference. A template whose tool messages do not render after a fixed prefix is refused at start.
- The tokenisation sanity check (verl's name): after every insertion, the row's conversation (its prompt replaced
  by the stand-in user message, its assistant contents decoded) is rendered whole and tokenised; where that
  differs from the stand-in prompt's ids + each turn's content ids + the inserted ids, the mismatch is counted
  (``agent/tokenization_mismatch``) and named once in a warning. Never a crash: the trajectory still holds exactly
  the ids the policy saw.
- A malformed call (bad JSON, not ``{"name", "arguments"}``, an unknown tool, arguments that do not fit the tool's
  JSON schema, or a call beyond ``max_parallel_calls``) is answered by a tool message naming the problem and what
  is allowed, and counted (``agent/invalid_calls``); the well-formed calls of the turn still run. A turn with
  calls of which none is well formed counts as an invalid action.
- A template without tool support (its render ignores ``tools``) gets the schemas in the system message, in the
  Hermes convention (``<tools>`` JSON lines ``</tools>``), and tool results wrapped in ``<tool_response>`` tags.
- Tool results are cut to ``max_tool_response_length`` tokens with a notice (``cut_result``).

The parsers (``parse_tool_calls``, ``parse_turn``) live here, with the format; the reward terms read a turn's calls
with them. Light at import (no torch, no transformers): the format registers itself when the config is checked.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search_r1.llm_agent.search_env import (
    RETRIEVAL,
    TRUNCATED_OBS_WARN_FRAC,
    SearchEnv,
    SearchFormat,
    SearchTrajectory,
)
from search_r1.tools import DEFAULT_TOOLS, SearchTool, ToolEnv
from verl.agent.format import Calls, Service, TurnContext
from verl.agent.trajectory import ActionKind
from verl.tools import Tool, ToolCallError, argument_problem, build_tools, read_tool_config, register_format

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from verl.config import DataConfig, MultiTurnConfig
    from verl.workers.rollout.base import GenerationOutput

logger = logging.getLogger(__name__)

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
STOP_STRINGS = ["</answer>"]  # a turn also ends at the template's end-of-turn (eos) token
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|\Z)", re.DOTALL)

# The stand-in conversation the insertions are computed against (``ChatFormat``).
_STAND_IN_USER = "Question?"
_STAND_IN_ANSWER = "I will look it up."

@dataclass
class ToolCall:
    """One ``<tool_call>`` block of a turn: the tool and its arguments, or why it cannot run."""

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None  # set: the call is malformed and this is the message the policy reads


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` block of one turn's text, in order (an unclosed last block is malformed)."""
    calls = []
    for match in _CALL.finditer(text):
        body, closed = match.group(1).strip(), match.group(0).endswith(CALL_CLOSE)
        if not closed:
            calls.append(ToolCall(None, None, f"the tool call is not closed with {CALL_CLOSE}"))
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append(ToolCall(None, None, f"the tool call is not valid JSON ({err.msg} at character {err.pos}); "
                                  'write {"name": <tool name>, "arguments": {<argument>: <value>, ...}}'))
            continue
        arguments = obj.get("arguments") if isinstance(obj, dict) else None
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(arguments, dict):
            calls.append(ToolCall(None, None, 'a tool call is a JSON object {"name": <tool name>, "arguments": '
                                  '{<argument>: <value>, ...}}'))
            continue
        calls.append(ToolCall(obj["name"], arguments))
    return calls


def parse_turn(text: str, finish_reason: str, stop_str: str | None, cut: bool) -> tuple[ActionKind, Any]:
    """The action of one turn from its decoded text (special tokens skipped) -> ANSWER with the answer (stopped at
    ``</answer>``), ACT with the turn's calls (ended with its end-of-turn token and wrote ``<tool_call>``), INVALID
    (``</answer>`` without its opening tag), EOS (ended without a call or an answer) or LENGTH. ``stop_str`` and
    ``cut`` as in ``tags.parse_action``."""
    end = text.rfind(stop_str) if stop_str and not cut else -1
    stripped = text[:end + len(stop_str)] if end >= 0 else text.rstrip()
    if stripped.endswith("</answer>"):
        start = stripped.rfind("<answer>")
        return (ActionKind.ANSWER, stripped[start + len("<answer>"):-len("</answer>")].strip()) if start >= 0 \
            else (ActionKind.INVALID, None)
    if cut or finish_reason == "length":
        return ActionKind.LENGTH, None
    calls = parse_tool_calls(text)
    return (ActionKind.ACT, calls) if calls else (ActionKind.EOS, None)


def check_calls(calls: list[ToolCall], tools: dict[str, Tool], max_parallel_calls: int) -> None:
    """Mark each call of an unknown tool, with arguments that do not fit its schema, or beyond the turn's
    ``max_parallel_calls`` well-formed calls, as malformed (its ``error`` says why and what is allowed)."""
    executed = 0
    for call in calls:
        if call.error is not None:
            continue
        if call.name not in tools:
            call.error = f"unknown tool {call.name!r}: the tools are {', '.join(sorted(tools))}"
        else:
            problem = argument_problem(tools[call.name].schema, call.arguments)
            if problem:
                call.error = f"tool {call.name!r}: {problem}"
            elif executed == max_parallel_calls:
                call.error = f"at most {max_parallel_calls} tool calls run per turn; this one was not run"
            else:
                executed += 1


async def run_calls(tools: dict[str, Tool], calls: list[ToolCall]) -> list[str | ToolCallError]:
    """The results of well-formed ``calls`` (any rows), in order: each tool answers all its calls at once."""
    by_tool: dict[str, list[int]] = {}
    for i, call in enumerate(calls):
        by_tool.setdefault(call.name, []).append(i)
    answers = await asyncio.gather(*(tools[name].call_many([calls[i].arguments for i in where])
                                     for name, where in by_tool.items()))
    results: list[str | ToolCallError] = [""] * len(calls)
    for where, answer in zip(by_tool.values(), answers, strict=True):
        for i, result in zip(where, answer, strict=True):
            results[i] = result
    return results


def error_message(error: str) -> str:
    return f"Error: {error}"


def cut_result(tokenizer: PreTrainedTokenizerBase, text: str, max_tokens: int) -> tuple[str, bool]:
    """``text`` cut to its first ``max_tokens`` tokens plus a notice saying so -> (text, cut)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text, False
    shown = tokenizer.decode(ids[:max_tokens], skip_special_tokens=True)
    return f"{shown}\n[... cut: {max_tokens} of {len(ids)} tokens shown]", True


class ChatFormat:
    """Renders the conversation pieces the loop inserts with the tokenizer's chat template and the tools' schemas."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, schemas: list[dict]) -> None:
        if not tokenizer.chat_template:
            raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format=hermes needs a tokenizer with a chat "
                             f"template; {tokenizer.name_or_path!r} has none (use format=search_r1 for a base model)")
        from verl.utils.tokenizer import template_shows_tools  # transformers: not at import (module docstring)

        self.tokenizer = tokenizer
        self.schemas = schemas
        self.native_tools = template_shows_tools(tokenizer, schemas)
        stand_in = [{"role": "user", "content": _STAND_IN_USER}, {"role": "assistant", "content": _STAND_IN_ANSWER}]
        self._stand_in = stand_in
        rendered = self.render(stand_in, generation_prompt=False)
        end = rendered.rfind(_STAND_IN_ANSWER)
        if end < 0:
            raise ValueError(f"the chat template of {tokenizer.name_or_path!r} does not render an assistant message's "
                             "content as given; the hermes format cannot compute its insertions")
        self.closing = rendered[end + len(_STAND_IN_ANSWER):]  # what the template writes after an assistant's content
        self._prefix = rendered

    def render(self, conversation: list[dict], generation_prompt: bool) -> str:
        from verl.utils.tokenizer import render_chat

        return render_chat(self.tokenizer, conversation, self.schemas, generation_prompt, self.native_tools)

    def insertion(self, messages: list[dict], after_eos: str | None) -> list[int]:
        """Ids of what follows an assistant turn: the rest of its closing (after ``after_eos``, the text of the
        sampled end-of-turn token; None = the turn did not end with one, the whole closing follows), ``messages``
        (tool or user) and the next generation prompt."""
        return self.tokenizer(self.insertion_text(messages, after_eos), add_special_tokens=False)["input_ids"]

    def insertion_text(self, messages: list[dict], after_eos: str | None) -> str:
        """The text of ``insertion`` (tokenised as one text; the cold start writes it as an inserted turn)."""
        full = self.render(self._stand_in + messages, generation_prompt=True)
        if not full.startswith(self._prefix):
            raise ValueError(f"the chat template of {self.tokenizer.name_or_path!r} renders the conversation before "
                             f"a {messages[0]['role']} message differently from the conversation alone; the hermes "
                             "format's insertions cannot be computed")
        closing = self.closing
        if after_eos is not None and closing.startswith(after_eos):
            closing = closing[len(after_eos):]
        return closing + full[len(self._prefix):]

    def check(self, turns: list[tuple[str, int | None, list[dict], list[int]]]) -> tuple[list[int], list[int]] | None:
        """The sanity check of one row: ``turns`` = (assistant content, the end-of-turn id the turn ended with or
        None, the messages inserted after it, their ids). None when the incremental ids equal the tokenised full
        render of the conversation (the stand-in prompt in place of the row's); else (incremental, full)."""
        conversation = [self._stand_in[0]]
        ids = self._encode(self.render(conversation, generation_prompt=True))
        for content, end_id, messages, inserted in turns:
            conversation = conversation + [{"role": "assistant", "content": content}] + messages
            ids = ids + self._encode(content) + ([end_id] if end_id is not None else []) + inserted
        full = self._encode(self.render(conversation, generation_prompt=True))
        return None if full == ids else (ids, full)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def describe_mismatch(tokenizer: PreTrainedTokenizerBase, incremental: list[int], full: list[int]) -> str:
    """Where the two tokenisations first differ, decoded around that position."""
    at = next((i for i, (a, b) in enumerate(zip(incremental, full, strict=False)) if a != b),
              min(len(incremental), len(full)))
    return (f"at token {at}: incremental {tokenizer.decode(incremental[at:at + 8])!r} vs full re-render "
            f"{tokenizer.decode(full[at:at + 8])!r}")


# The user message after a turn that neither called a tool nor answered well (cut at max_response_length, or an
# </answer> without its opening tag): the tag format's feedback, in this format's words.
HERMES_FEEDBACK = ("My previous turn was not valid. To use a tool, I must write a tool call as JSON inside the "
                   "tool_call tags and end my turn; to finish, I must write the final answer between the answer and "
                   "/answer tags. Let me try again.")


@register_format("hermes")
class HermesFormat(SearchFormat):
    """The hermes format (module docstring): the tools of ``multi_turn.tool_config_path`` (null: ``search`` alone),
    their results cut to ``multi_turn.max_tool_response_length`` (null: ``data.max_obs_length``)."""

    stop = STOP_STRINGS
    uses_tools = True

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env: SearchEnv, multi: MultiTurnConfig,
                 data: DataConfig) -> None:
        super().__init__(tokenizer, env)
        self.max_parallel_calls = multi.max_parallel_calls
        self.result_limit = multi.max_tool_response_length or data.max_obs_length  # results are cut, our errors not
        specs = DEFAULT_TOOLS if multi.tool_config_path is None else read_tool_config(multi.tool_config_path)
        self._calls: Calls | None = None  # the run's (``services``): the search tool's requests go through it
        tool_env = ToolEnv(retrieve=lambda queries: self._calls.batch(RETRIEVAL, queries), client=env.client,
                           do_search=env.do_search)
        self.tools = build_tools(specs, tool_env)
        self.chat = ChatFormat(tokenizer, [s.schema for s in specs])
        self._warned_mismatch = False
        self._warned_cut = False

    def services(self, calls: Calls) -> list[Service]:
        """The retrieval service, and ``tools``: every row's well-formed calls of a turn, answered at once."""
        self._calls = calls
        return [self.env.service(), Service("tools", self._run_calls_per_row, blocking=False)]

    async def _run_calls_per_row(self, calls_per_row: list[list[ToolCall]]) -> list[list[str | ToolCallError]]:
        results = await run_calls(self.tools, [call for calls in calls_per_row for call in calls])
        starts = [0, *itertools.accumulate(len(calls) for calls in calls_per_row)]
        return [results[a:b] for a, b in itertools.pairwise(starts)]

    def parse(self, ids: list[int], out: GenerationOutput, cut: bool) -> tuple[ActionKind, Any]:
        return parse_turn(self.tokenizer.decode(ids, skip_special_tokens=True), out.finish_reason, out.stop_str, cut)

    def feedback(self, ctx: TurnContext) -> list[int]:
        """The ids of the feedback message after an invalid turn (the assistant message closed first)."""
        messages = [{"role": "user", "content": HERMES_FEEDBACK}]
        inserted = self.chat.insertion(messages, after_eos=None)
        ctx.row.chat_turns.append((self._content(ctx.ids, None), None, messages, inserted))
        return inserted

    async def act(self, ctx: TurnContext, action: Any) -> None:
        """Run the turn's well-formed calls (``action``), append every call's result (or error) as tool messages."""
        calls: list[ToolCall] = action
        row: SearchTrajectory = ctx.row
        check_calls(calls, self.tools, self.max_parallel_calls)
        good = [c for c in calls if c.error is None]
        row.num_tool_calls += len(good)
        row.num_invalid_calls += len(calls) - len(good)
        row.num_invalid += not good
        results = iter(await ctx.call("tools", good) if good else [])
        texts = [error_message(c.error) if c.error is not None else self._result_text(row, next(results))
                 for c in calls]
        messages = [{"role": "tool", "content": text} for text in texts]
        eos_id = ctx.ids[-1]  # the turn ended with an end-of-turn token (``parse``)
        inserted = self.chat.insertion(messages, after_eos=self.tokenizer.decode([eos_id]))
        if not ctx.insert(inserted):
            return
        row.num_searches += sum(isinstance(self.tools[c.name], SearchTool) for c in good)
        row.queries += [str(c.arguments.get("query")) if isinstance(self.tools[c.name], SearchTool)
                        else f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in good]
        row.chat_turns.append((self._content(ctx.ids, eos_id), eos_id, messages, inserted))
        mismatch = self.chat.check(row.chat_turns)
        if mismatch is not None:
            row.tokenization_mismatch += 1
            if not self._warned_mismatch:
                self._warned_mismatch = True
                logger.warning("tokenisation sanity check: the ids the loop appended differ from a full re-render of "
                               "the conversation by the chat template (agent/tokenization_mismatch), %s; the policy "
                               "is trained on the ids it saw", describe_mismatch(self.tokenizer, *mismatch))

    def _result_text(self, row: SearchTrajectory, result: str | ToolCallError) -> str:
        """A tool's answer as the policy reads it: a refusal as an error, a result cut to ``result_limit`` tokens
        (counted in the row's ``truncated_obs``)."""
        if isinstance(result, ToolCallError):
            return error_message(str(result))
        text, cut = cut_result(self.tokenizer, result, self.result_limit)
        row.truncated_obs += cut
        return text

    def finish(self, rows: list[SearchTrajectory]) -> None:
        """Warn once when more than TRUNCATED_OBS_WARN_FRAC of a call's tool results were cut (the sanity check warns
        as it finds a mismatch, ``act``)."""
        calls, cut = sum(r.num_tool_calls for r in rows), sum(r.truncated_obs for r in rows)
        if self._warned_cut or calls == 0 or cut <= TRUNCATED_OBS_WARN_FRAC * calls:
            return
        self._warned_cut = True
        logger.warning("%d of %d tool results were longer than %d tokens and were cut (agent/truncated_obs): raise "
                       "actor_rollout_ref.rollout.multi_turn.max_tool_response_length (null = data.max_obs_length)",
                       cut, calls, self.result_limit)

    def _content(self, ids: list[int], eos_id: int | None) -> str:
        """The assistant content of a turn's ids (without its end-of-turn token), as the template would get it."""
        body = ids[:-1] if eos_id is not None else ids
        return self.tokenizer.decode(body, skip_special_tokens=False)
