"""Text of the blocks the environment inserts into a trajectory (shared by the loop and the SFT data).

Choices: passages are rendered as Search-R1 renders them (``Doc i(Title: T) text``) so that
checkpoints trained with Search-R1 see the format they know. The invalid-action feedback names the
tags in words and never writes a literal tag: the reward takes the last ``<answer>`` block of the
response, so a literal example answer inside inserted text would be scored as the policy's answer.
"""

from __future__ import annotations

# The observation block is INFO_OPEN + passages + INFO_CLOSE; the loop tokenises the three parts
# separately so that it can truncate the passages and still close the block.
INFO_OPEN = "\n\n<information>"
INFO_CLOSE = "</information>\n\n"
# Appended after a turn that ended in neither a well-formed search nor a well-formed answer.
INVALID_ACTION_FEEDBACK = (
    "\n\nMy previous action was not valid. To search, I must write a non-empty query between the "
    "search and /search tags; to finish, I must write the final answer between the answer and "
    "/answer tags. Let me try again.\n\n"
)


def split_title(contents: str) -> tuple[str, str]:
    """Corpus ``contents`` are '"Title"\\ntext'; returns (title, text)."""
    first, _, rest = contents.partition("\n")
    return first.strip().strip('"'), rest.strip()


def format_passages(docs: list[dict]) -> str:
    """Retrieved docs ({"id", "contents"}) -> 'Doc 1(Title: T) text\\nDoc 2(Title: ...) ...'."""
    lines = []
    for i, doc in enumerate(docs, start=1):
        title, text = split_title(doc["contents"])
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return "\n".join(lines)


def information_block(docs: list[dict]) -> str:
    """The observation appended after a search: the passages inside <information> tags."""
    return INFO_OPEN + format_passages(docs) + INFO_CLOSE
