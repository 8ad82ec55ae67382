"""A cold-start trajectory's turns written in each action format, as the loop renders them: the scripted searcher's
(``data_prep.cold_start``) and the teacher's (``data_prep.teacher``) go through the same objects, so both sources
write one layout per format.

- ``TagTurns``: Search-R1's tags; the inserted blocks are the ``<information>`` passages and the invalid-action
  feedback (``search_r1.llm_agent.formatting``).
- ``HermesTurns``: tool calls in one tokenizer's chat template (``search_r1.llm_agent.hermes``): a call is
  ``<tool_call>{"name", "arguments"}</tool_call>``, a turn that calls ends with the template's end-of-turn token, the
  results are tool messages and the feedback a user message, each inserted as ``ChatFormat`` computes it.

The scripted searcher's words (``SEARCH``, ``BRIDGE``, ``REPHRASE``, ``ANSWER``) say what it does in a few plain
words: the cold start teaches the protocol, not a style of reasoning.
"""

from __future__ import annotations

import json

from search_r1.llm_agent import hermes, tags
from search_r1.llm_agent.formatting import feedback_turn, information_turn, policy_turn
from search_r1.llm_agent.hermes import CALL_CLOSE, CALL_OPEN, HERMES_FEEDBACK, ChatFormat
from search_r1.prompts import DEFAULT_TEMPLATE, HERMES_TEMPLATE
from search_r1.tools import SEARCH_SCHEMA, format_hits

SEARCH = "<think> I need to search for this. </think><search> {query} </search>"
BRIDGE = "<think> The passages name {query}; I need to search for it. </think><search> {query} </search>"
REPHRASE = "<think> The passages do not say; I need to search for {query}. </think><search> {query} </search>"
# why a search is made -> the policy's words for it: the question itself, a name the passages gave (two-hop), or a
# phrase of the question after its own passages did not answer it
SEARCH_WORDS = {"question": SEARCH, "bridge": BRIDGE, "rephrase": REPHRASE}
ANSWER = "<think> The passages say it is {answer}. </think><answer> {answer} </answer>"


class TagTurns:
    """Turns in Search-R1's tags, as the tag-format loop renders them."""

    tools: list[dict] | None = None  # the prompt shows no tools
    template = DEFAULT_TEMPLATE
    stop = tags.STOP_STRINGS  # where a policy turn ends

    def search(self, query: str, why: str = "question") -> dict:
        """The policy's turn searching ``query``; ``why``: a key of ``SEARCH_WORDS``."""
        return policy_turn(SEARCH_WORDS[why].format(query=query))

    def passages(self, docs: list[dict]) -> dict:
        return information_turn(docs)

    def feedback(self) -> dict:
        """What the loop inserts after a turn with no well-formed action."""
        return feedback_turn()

    def answer(self, answer: str) -> dict:
        return policy_turn(ANSWER.format(answer=answer))


TAG_TURNS = TagTurns()


class HermesTurns(TagTurns):
    """Turns in the hermes format for ``tokenizer``'s chat template, exactly as the hermes loop inserts them
    (``search_r1.llm_agent.hermes.ChatFormat``): a search is a ``search`` tool call ending the turn with the template's
    end-of-turn token, the passages a tool message (``search_r1.tools.format_hits``); the prompt shows the search tool
    and asks in ``HERMES_TEMPLATE``'s words."""

    tools = [SEARCH_SCHEMA]
    template = HERMES_TEMPLATE
    stop = hermes.STOP_STRINGS  # and the end-of-turn token

    def __init__(self, tokenizer) -> None:
        self.chat = ChatFormat(tokenizer, self.tools)
        self.eos = tokenizer.eos_token

    def search(self, query: str, why: str = "question") -> dict:
        think = SEARCH_WORDS[why].format(query=query).split("<search>")[0]
        return self.ended(think + self.call("search", {"query": query}))

    @staticmethod
    def call(name: str, arguments: dict | str) -> str:
        """One tool call as the policy writes it."""
        return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CALL_CLOSE}"

    def ended(self, text: str) -> dict:
        """A policy turn that ended with the end-of-turn token (sampled, so trained)."""
        return policy_turn(text + self.eos)

    def passages(self, docs: list[dict]) -> dict:
        return self.results([format_hits(docs)])

    def results(self, texts: list[str]) -> dict:
        """The tool messages answering a turn's calls, one per call, inserted after its end-of-turn token."""
        messages = [{"role": "tool", "content": text} for text in texts]
        return {"text": self.chat.insertion_text(messages, after_eos=self.eos), "sampled": False}

    def feedback(self) -> dict:
        """The feedback user message after a turn that neither called a tool nor answered well (no end-of-turn token
        sampled: the template's whole closing comes first)."""
        messages = [{"role": "user", "content": HERMES_FEEDBACK}]
        return {"text": self.chat.insertion_text(messages, after_eos=None), "sampled": False}
