"""Prompt ids and padding id for any Hugging Face tokenizer, as users bring them (docs/design.md, Any causal LM).

Choices, following Search-R1 for base models: a tokenizer with a chat template renders the messages through it
(generation prompt added; whatever the template inserts, a default system prompt or its own bos, is kept); a
tokenizer without one (a base model) gets the messages' contents joined as plain text, tokenised with the
tokenizer's own special-token rule (Llama-style tokenizers add bos, Qwen-style ones add nothing). Either way a
prompt never starts with two bos tokens. A tokenizer without a pad token pads with its eos token (the masks, not
the pad id, say which positions are padding, so pad = eos is safe).

Tools (an action format that calls tools): their JSON schemas go to the chat template (``tools=``); a template that
ignores them (its render does not name the tools) gets them in the system message in the common ``<tools>``
convention (``<tools>`` JSON lines ``</tools>``, calls as ``<tool_call>`` JSON; for example Qwen's and the Hermes
models' templates), and tool results wrapped in ``<tool_response>`` tags.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

# How a base model's prompt joins its messages' contents (Search-R1 uses the single user message's content as is).
PLAIN_TEXT_JOIN = "\n\n"

TOOLS_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML "
    "tags. You may call one or more functions to assist with the user query. Don't make assumptions about what "
    "values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\nFor each function "
    "call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>")


def template_shows_tools(tokenizer: PreTrainedTokenizerBase, tools: list[dict]) -> bool:
    """Whether the chat template renders the ``tools`` it is given (each tool's name appears in the prompt)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Question?"}], tools=tools, tokenize=False,
                                             add_generation_prompt=True)
    return all(t["function"]["name"] in rendered for t in tools)


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict], tools: list[dict],
                generation_prompt: bool, native: bool | None = None) -> str:
    """The text of ``messages`` with ``tools`` (JSON schemas) through the chat template (module docstring).
    ``native``: whether the template shows tools itself (``template_shows_tools``; computed when None)."""
    if native is None:
        native = template_shows_tools(tokenizer, tools)
    messages = [dict(m) for m in messages]
    if not native:
        system = TOOLS_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = messages[0]["content"] + "\n\n" + system
        else:
            messages.insert(0, {"role": "system", "content": system})
        for m in messages:
            if m["role"] == "tool":
                m["content"] = f"<tool_response>\n{m['content']}\n</tool_response>"
    return tokenizer.apply_chat_template(messages, tools=tools if native else None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``tokenizer`` carries a chat template (instruct models do; base models often do not)."""
    return bool(tokenizer.chat_template)


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict],
                  tools: list[dict] | None = None) -> list[int]:
    """Token ids of the prompt ``messages`` ([{role, content}, ...]) as the policy sees it: through the chat
    template with the generation prompt when there is one, else the contents joined as plain text (bos added
    when the tokenizer adds it). A leading doubled bos (a template or text that writes bos itself, tokenised by
    a tokenizer that adds one too) is cut to one. ``tools``: JSON schemas shown to the policy (``render_chat``;
    needs a chat template)."""
    if tools:
        if not has_chat_template(tokenizer):
            raise ValueError(f"tools need a chat template; the tokenizer {tokenizer.name_or_path!r} has none")
        ids = tokenizer(render_chat(tokenizer, messages, tools, generation_prompt=True),
                        add_special_tokens=False)["input_ids"]
    elif has_chat_template(tokenizer):
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
