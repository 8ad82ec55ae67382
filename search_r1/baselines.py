"""The paper's baselines as modes of the evaluation (``python -m search_r1.evaluate --mode``; Search-R1, Table 2).

- ``agent`` (the default): the policy searches as it was trained to (the training loop as it is).
- ``direct``: Direct inference. Each question is asked again under ``prompts.NO_SEARCH_TEMPLATE`` (reason, then
  answer; no search offered) and the loop runs with search disabled (``max_turns=0``): one turn, no retrieval call,
  nothing inserted. R1 (GRPO trained with search disabled on the same prompt) is evaluated in this mode too.
- ``rag``: RAG. The ``retriever.topk`` passages retrieved with the question itself (one ``/retrieve`` request per
  evaluation batch, before that batch generates) are put in the prompt (``prompts.RAG_TEMPLATE``, shown as a
  search's ``<information>`` block shows them) and the loop runs with search disabled: the model answers from them
  with no further search.

Choices: every mode runs the same loop, scoring, bootstrap and reports (``search_r1.evaluate``); a baseline differs
only in its prompt and in ``max_turns=0``, the flag that also trains R1 through the trainer. The question is read
back from a row's user message with the template it was made with (the tag format's, the hermes format's or the
no-search one; ``question_of``), so the baselines run on the same parquet as the agent; a row made from another
template is an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable

from search_r1.llm_agent.formatting import format_passages
from search_r1.prompts import (
    DEFAULT_TEMPLATE,
    HERMES_TEMPLATE,
    NO_SEARCH_TEMPLATE,
    make_prompt,
    question_of,
    rag_prompt,
)

MODES = ("agent", "direct", "rag")
SEARCH_DISABLED = "max_turns=0"  # the config override of both baselines (and of R1's training)
SOURCE_TEMPLATES = (DEFAULT_TEMPLATE, HERMES_TEMPLATE, NO_SEARCH_TEMPLATE)

# queries -> the passages of each ({"id", "contents"}), one request (the retrieval client's ``search``)
SearchFn = Callable[[list[str]], list[list[dict]]]


def row_question(row: dict, where: str) -> str:
    """The question of one QA row (Search-R1 schema), read back from its last user message."""
    content = row["prompt"][-1]["content"]
    for template in SOURCE_TEMPLATES:
        question = question_of(content, template)
        if question is not None:
            return question
    raise ValueError(f"{where}: its prompt {content[:60]!r}... was not made from the tag format's, the hermes "
                     "format's or the no-search template (search_r1.prompts), so the question cannot be read back "
                     "for a baseline mode")


def baseline_messages(mode: str, rows: list[dict], where: list[str], search: SearchFn | None
                      ) -> tuple[list[list[dict]], list[str]]:
    """The chat messages of ``rows`` under ``mode`` (``direct`` or ``rag``) and the passages put into each prompt
    (RAG's text, ``""`` for direct) -> (messages per row, passages per row). ``rag`` makes exactly one ``search``
    call, for all rows' questions; ``direct`` none. ``where``: each row's name for errors."""
    if mode not in ("direct", "rag"):
        raise ValueError(f"baseline mode {mode!r}; allowed: direct, rag")
    questions = [row_question(row, w) for row, w in zip(rows, where, strict=True)]
    if mode == "direct":
        passages = [""] * len(rows)
        texts = [make_prompt(q, NO_SEARCH_TEMPLATE) for q in questions]
    else:
        if search is None:
            raise ValueError("--mode rag needs the retrieval service (--retriever-url)")
        docs_per_row = search(questions)
        if len(docs_per_row) != len(questions):
            raise RuntimeError(f"retrieval returned {len(docs_per_row)} results for {len(questions)} questions")
        passages = [format_passages(docs) for docs in docs_per_row]
        texts = [rag_prompt(q, p) for q, p in zip(questions, passages, strict=True)]
    messages = [[*row["prompt"][:-1], {**row["prompt"][-1], "content": text}] for row, text in zip(rows, texts,
                                                                                                   strict=True)]
    return messages, passages
