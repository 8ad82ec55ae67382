"""The instruction given to the policy, shared by real-data prep, the demo data and inference.

It follows Search-R1's protocol (think, then search or answer, with retrieved passages returned
inside <information> tags); the wording is ours. One template serves every data source, so a
policy trained on the demo data and one trained on NQ see the same instructions.
"""

from __future__ import annotations

INSTRUCTION = (
    "Answer the question. First reason inside <think> and </think>. "
    "If you need facts you do not have, search by writing <search> your query </search>; "
    "the top results will be shown to you inside <information> and </information>. "
    "You may search several times. When you know the answer, give only the answer inside "
    "<answer> and </answer>, for example <answer> Paris </answer>. Question: "
)


def make_prompt(question: str) -> str:
    """The user message for ``question``: whitespace stripped, a final '?' added if missing."""
    question = question.strip()
    if not question:
        raise ValueError("empty question")
    if not question.endswith("?"):
        question += "?"
    return INSTRUCTION + question + "\n"
