"""Prompt ids and padding id for any Hugging Face tokenizer, as users bring them (docs/design.md, Any causal LM).

Choices, following Search-R1 for base models: a tokenizer with a chat template renders the messages through it
(generation prompt added; whatever the template inserts, a default system prompt or its own bos, is kept); a
tokenizer without one (a base model) gets the messages' contents joined as plain text, tokenised with the
tokenizer's own special-token rule (Llama-style tokenizers add bos, Qwen-style ones add nothing). Either way a
prompt never starts with two bos tokens. A tokenizer without a pad token pads with its eos token (the masks, not
the pad id, say which positions are padding, so pad = eos is safe).
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

# How a base model's prompt joins its messages' contents (Search-R1 uses the single user message's content as is).
PLAIN_TEXT_JOIN = "\n\n"


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``tokenizer`` carries a chat template (instruct models do; base models often do not)."""
    return bool(tokenizer.chat_template)


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict]) -> list[int]:
    """Token ids of the prompt ``messages`` ([{role, content}, ...]) as the policy sees it: through the chat
    template with the generation prompt when there is one, else the contents joined as plain text (bos added
    when the tokenizer adds it). A leading doubled bos (a template or text that writes bos itself, tokenised by
    a tokenizer that adds one too) is cut to one."""
    if has_chat_template(tokenizer):
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
    else:
        text = PLAIN_TEXT_JOIN.join(m["content"] for m in messages)
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    ids = [int(t) for t in ids]
    bos = tokenizer.bos_token_id
    while bos is not None and len(ids) >= 2 and ids[0] == ids[1] == bos:
        ids = ids[1:]
    return ids


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that fills padding positions: the pad token's, else the eos token's (Llama 3, Mistral and many base
    models ship no pad token)."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    if tokenizer.eos_token_id is not None:
        return tokenizer.eos_token_id
    raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token: set one "
                     "(tokenizer.pad_token = ...) and save it with the model")
