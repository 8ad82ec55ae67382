"""Text of the blocks the environment inserts into a trajectory (shared by the loop and the SFT data)."""

from __future__ import annotations


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
    return "\n\n<information>" + format_passages(docs) + "</information>\n\n"
