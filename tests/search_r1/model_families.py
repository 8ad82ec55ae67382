"""Tiny random models of the families users bring (Llama 3, Qwen2.5, Qwen3, Gemma 3, Mistral, a base model with no
chat template), each with a tokenizer built here in its family's shape: no downloads.

A family is its transformers model class (built from a tiny config: hidden 64, 2 layers), its tokenizer's shape and
its quirks, the ones that broke or could break a loop written for one model:

- llama: byte-level BPE; bos from the post-processor and the template (Llama 3 headers); no pad; eos
  ``<|eot_id|>`` and ``<|end_of_text|>``; tied head.
- qwen2: byte-level BPE; no bos; pad ``<|endoftext|>``; Qwen2.5's template, which inserts a system prompt; tied.
- qwen3: byte-level BPE; no bos; pad of its own; ChatML with no system prompt; query/key norms; untied.
- gemma3: SentencePiece-style pieces (``▁``, no prefix space); bos from the template; pad of its own;
  ``<start_of_turn>`` turns whose end is a second eos; the text-only class; tied.
- mistral: SentencePiece-style (``▁`` prefix); bos from the post-processor; no pad; ``[INST] .. [/INST]``; untied.
- base: SentencePiece-style; bos from the post-processor; pad = eos; no chat template (plain text); untied.

The search tags are ordinary text in every family here, not added tokens (``</search>`` is four tokens in the
byte-level vocabularies, one learned piece in the SentencePiece-style ones), so stop strings are found only in
decoded text. The vocabularies are small (500 tokens) to keep
a trainer step per family fast; Qwen2.5's real 151k vocabulary has its own loop tests
(``tests/search_r1/llm_agent/test_agent_real_vocab.py``, ``test_agent_hf.py``), and a 262k one its log-prob memory
test (``tests/verl/algorithms/test_logprobs.py``).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from data_prep.qwen_tokenizer import CHAT_TEMPLATE as QWEN25_TEMPLATE

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
    "{% endif %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")


@dataclass(frozen=True)
class Family:
    """How one family's tokenizer and model are shaped (module docstring)."""

    name: str
    model_class: type[PreTrainedModel]
    config_class: type
    specials: list[str]  # control tokens, the first ones given ids 0, 1, ...
    eos: str
    bos: str | None = None
    pad: str | None = None  # None: the tokenizer has no pad token
    template: str | None = None  # None: a base model
    sentencepiece: bool = False  # ``▁``-spaced pieces (Metaspace) instead of byte-level BPE
    prefix_space: bool = True  # SentencePiece style: a ``▁`` before the first word
    post_bos: bool = False  # the tokenizer's post-processor adds bos to every encoding
    tied: bool = True
    extra_eos: list[str] = field(default_factory=list)  # further ids that end generation (generation_config)
    config: dict = field(default_factory=dict)  # family-specific config keys


FAMILIES = {f.name: f for f in [
    Family("llama", LlamaForCausalLM, LlamaConfig, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                                     "<|end_header_id|>", "<|eot_id|>"],
           eos="<|eot_id|>", bos="<|begin_of_text|>", template=LLAMA3_TEMPLATE, post_bos=True, tied=True,
           extra_eos=["<|end_of_text|>"], config={"rope_theta": 500000.0}),
    Family("qwen2", Qwen2ForCausalLM, Qwen2Config, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos="<|im_end|>",
           pad="<|endoftext|>", template=QWEN25_TEMPLATE, tied=True),
    Family("qwen3", Qwen3ForCausalLM, Qwen3Config, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos="<|im_end|>",
           pad="<|endoftext|>", template=CHATML_TEMPLATE, tied=False, config={"head_dim": 16}),
    Family("gemma3", Gemma3ForCausalLM, Gemma3TextConfig, ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>",
                                                           "<end_of_turn>"],
           eos="<eos>", bos="<bos>", pad="<pad>", template=GEMMA_TEMPLATE, sentencepiece=True, prefix_space=False,
           tied=True, extra_eos=["<end_of_turn>"],
           config={"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64,
                   "layer_types": ["sliding_attention", "full_attention"]}),
    Family("mistral", MistralForCausalLM, MistralConfig, ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], eos="</s>",
           bos="<s>", template=MISTRAL_TEMPLATE, sentencepiece=True, post_bos=True, tied=False),
    Family("base", LlamaForCausalLM, LlamaConfig, ["<unk>", "<s>", "</s>"], eos="</s>", bos="<s>", pad="</s>",
           sentencepiece=True, post_bos=True, tied=False),
]}


def build_tokenizer(family: Family, texts: list[str], vocab_size: int = 500) -> PreTrainedTokenizerFast:
    """A BPE tokenizer trained on ``texts`` in ``family``'s shape."""
    if family.sentencepiece:
        tok = Tokenizer(models.BPE(unk_token="<unk>" if "<unk>" in family.specials else None))
        scheme = "first" if family.prefix_space else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
        alphabet = [c for c in string.printable if c != " "] + ["▁"]  # spaces are ▁; newlines kept
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=family.specials,
                                                       initial_alphabet=alphabet, show_progress=False))
    if family.post_bos:
        bos_id = tok.token_to_id(family.bos)
        tok.post_processor = processors.TemplateProcessing(single=f"{family.bos} $A", pair=f"{family.bos} $A $B",
                                                           special_tokens=[(family.bos, bos_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=family.eos, bos_token=family.bos,
                                   pad_token=family.pad, unk_token="<unk>" if "<unk>" in family.specials else None)
    fast.chat_template = family.template
    return fast


def build_model(family: Family, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> PreTrainedModel:
    """A random ``family`` model for ``tokenizer``: hidden 64, 2 layers, 4 heads (2 key/value heads)."""
    import torch

    torch.manual_seed(seed)
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in [family.eos, *family.extra_eos]]
    config = family.config_class(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=family.tied, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_ids[0],
        pad_token_id=tokenizer.pad_token_id, **family.config)
    model = family.model_class(config)
    # Embeddings (and an untied head) of unit scale instead of 0.02: the memorised trajectory is then also the one
    # sampling at temperature 1 follows (with 0.02 the logits stay near-uniform after memorising)
    torch.nn.init.normal_(model.get_input_embeddings().weight, std=1.0)
    if not family.tied:
        torch.nn.init.normal_(model.get_output_embeddings().weight, std=1.0)
    model.generation_config.eos_token_id = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
