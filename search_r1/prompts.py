"""The instruction given to the policy, shared by real-data prep, the demo data and inference.

It follows Search-R1's protocol (think, then search or answer, with retrieved passages returned
inside <information> tags); the wording is ours. One template serves every data source, so a
policy trained on the demo data and one trained on NQ see the same instructions. Data prep can take
another template from a file (``load_template``; ``data_prep.qa_search --template``), e.g. the exact
prompt of a paper one compares with: its ``{question}`` placeholder receives the question. The hermes action
format has its own template (``HERMES_TEMPLATE``: the tools are in the chat template, the instruction names the
answer tags only); ``retemplate`` moves a prompt made under one template to another.

The paper's baselines (Search-R1, Table 2) have prompts of their own, used with search disabled (``max_turns=0``):
``NO_SEARCH_TEMPLATE`` (Direct inference and R1: reason, then answer; no search is offered) and ``RAG_TEMPLATE``
(the passages retrieved with the question are in the prompt; ``rag_prompt``).
"""

from __future__ import annotations

from pathlib import Path

INSTRUCTION = (
    "Answer the question. First reason inside <think> and </think>. "
    "If you need facts you do not have, search by writing <search> your query </search>; "
    "the top results will be shown to you inside <information> and </information>. "
    "You may search several times. When you know the answer, give only the answer inside "
    "<answer> and </answer>, for example <answer> Paris </answer>. Question: "
)
PLACEHOLDER = "{question}"
DEFAULT_TEMPLATE = INSTRUCTION + PLACEHOLDER + "\n"
# The hermes action format (actor_rollout_ref.rollout.multi_turn.format=hermes): the tools are described by the chat
# template (their JSON schemas), so the instruction names the answer tags only.
HERMES_INSTRUCTION = (
    "Answer the question. If you need facts you do not have, call the search tool; you may call it several times. "
    "When you know the answer, give only the answer inside <answer> and </answer>, for example "
    "<answer> Paris </answer>. Question: "
)
HERMES_TEMPLATE = HERMES_INSTRUCTION + PLACEHOLDER + "\n"
TEMPLATES = {"search_r1": DEFAULT_TEMPLATE, "hermes": HERMES_TEMPLATE}  # per action format
# Search disabled (max_turns=0): the policy answers in its one turn, so the prompt offers no search.
NO_SEARCH_INSTRUCTION = (
    "Answer the question. First reason inside <think> and </think>, then give only the answer inside "
    "<answer> and </answer>, for example <answer> Paris </answer>. Question: "
)
NO_SEARCH_TEMPLATE = NO_SEARCH_INSTRUCTION + PLACEHOLDER + "\n"
PASSAGES = "{passages}"
# RAG: the passages retrieved with the question, shown as a search's <information> block shows them.
RAG_TEMPLATE = (
    "Answer the question using the passages below. First reason inside <think> and </think>, then give only the "
    "answer inside <answer> and </answer>, for example <answer> Paris </answer>.\nPassages:\n" + PASSAGES
    + "\nQuestion: " + PLACEHOLDER + "\n"
)


def load_template(path: str | Path) -> str:
    """A prompt template read from ``path`` (UTF-8); it must hold the ``{question}`` placeholder."""
    text = Path(path).read_text(encoding="utf-8")
    if PLACEHOLDER not in text:
        raise ValueError(f"prompt template {path} has no {PLACEHOLDER} placeholder (where the question goes)")
    return text


def make_prompt(question: str, template: str = DEFAULT_TEMPLATE) -> str:
    """The user message for ``question`` under ``template``: the question stripped, a final '?' added if missing,
    put in place of every ``{question}`` (other braces in the template are kept as they are)."""
    question = question.strip()
    if not question:
        raise ValueError("empty question")
    if not question.endswith("?"):
        question += "?"
    return template.replace(PLACEHOLDER, question)


def question_of(prompt: str, template: str = DEFAULT_TEMPLATE) -> str | None:
    """The question ``make_prompt`` put into ``prompt`` under ``template`` (the text its first ``{question}`` took),
    or None when ``prompt`` was not made from ``template``."""
    before, _, after = template.partition(PLACEHOLDER)
    after = after.split(PLACEHOLDER)[0]
    if not prompt.startswith(before):
        return None
    rest = prompt[len(before):]
    end = rest.find(after) if after else len(rest)
    question = rest[:end].strip() if end >= 0 else ""
    return question or None


def retemplate(prompt: str, template: str, source: str = DEFAULT_TEMPLATE) -> str:
    """``prompt`` (made from ``source``) made again under ``template``; ValueError when it was not made from
    ``source``."""
    question = question_of(prompt, source)
    if question is None:
        raise ValueError(f"prompt {prompt[:80]!r}... was not made from the given source template")
    return make_prompt(question, template)


def rag_prompt(question: str, passages: str, template: str = RAG_TEMPLATE) -> str:
    """The user message of RAG for ``question`` with ``passages`` (the retrieved passages' text,
    ``formatting.format_passages``) in place of ``{passages}``."""
    return make_prompt(question, template).replace(PASSAGES, passages)
