"""Text and token ids of the blocks the environment inserts into a trajectory (shared by the loop and the SFT data).

Choices: passages are rendered as Search-R1 renders them (``Doc i(Title: T) text``) so that
checkpoints trained with Search-R1 see the format they know. The invalid-action feedback names the
tags in words and never writes a literal tag: the reward takes the last ``<answer>`` block of the
response, so a literal example answer inside inserted text would be scored as the policy's answer.
An observation block is tokenised as one text when it fits (``observation_ids``), so that a real
BPE vocabulary tokenises it as it would anywhere else (it merges across the tag boundaries, e.g.
``.</`` or ``>Doc``); only a block that must be cut is tokenised in three parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The observation block is INFO_OPEN + passages + INFO_CLOSE.
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


def policy_turn(text: str) -> dict:
    """A turn the policy writes (trained), as the SFT data hold it (``verl.utils.sft_dataset``)."""
    return {"text": text, "sampled": True}


def information_turn(docs: list[dict]) -> dict:
    """The ``<information>`` block the loop inserts after a search (context only), as the SFT data hold it."""
    return {"text": information_block(docs), "sampled": False}


def feedback_turn() -> dict:
    """The feedback the loop inserts after a turn with no well-formed action (context only), as the SFT data hold
    it."""
    return {"text": INVALID_ACTION_FEEDBACK, "sampled": False}


def observation_ids(tokenizer: PreTrainedTokenizerBase, docs_per_row: list[list[dict]],
                    max_obs_length: int) -> list[tuple[list[int], bool]]:
    """Token ids of each row's ``<information>`` block, at most ``max_obs_length`` -> [(ids, truncated)].

    A block that fits is the tokenisation of its whole text. A longer one is cut: the tags and the
    passages are tokenised separately, the passages cut to the room the tags leave, then the block
    is closed. ``max_obs_length`` must leave room for at least one passage token.
    """
    def encode(texts: list[str]) -> list[list[int]]:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]

    open_ids, close_ids = encode([INFO_OPEN, INFO_CLOSE])
    room = max_obs_length - len(open_ids) - len(close_ids)
    if room < 1:
        raise ValueError(f"data.max_obs_length={max_obs_length} leaves no room for passages between "
                         f"the {len(open_ids) + len(close_ids)} tokens of the information tags")
    if not docs_per_row:
        return []
    blocks = encode([information_block(docs) for docs in docs_per_row])
    out = []
    for block, docs in zip(blocks, docs_per_row, strict=True):
        if len(block) <= max_obs_length:
            out.append((block, False))
        else:
            (body,) = encode([format_passages(docs)])
            out.append((open_ids + body[:room] + close_ids, True))
    return out
