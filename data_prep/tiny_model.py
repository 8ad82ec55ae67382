"""A tiny real causal LM built in-project: byte-level BPE tokenizer + Qwen2-architecture model.

Used by the embedded default (``data_prep/tiny_policy.py`` warm-starts it) and by the tests.
Choices: Qwen2 architecture because vLLM and transformers both load it natively; head_dim 64
because vLLM's CPU attention rejects head_dim 16 (docs/design.md, "Constraints of the target machines"); the
search-loop tags are single added tokens so that stop strings fall on token boundaries; a Qwen-style chat
template so the same code path serves real Qwen2.5 checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# Tags of the search loop: one token each, kept when decoding.
TAG_TOKENS = ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
              "<answer>", "</answer>"]
# Chat control tokens: special (skipped by skip_special_tokens=True).
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``; tags and chat tokens are single tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, additional_special_tokens=["<|im_start|>"])
    fast.add_tokens(TAG_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast, hidden_size: int = 128, num_layers: int = 2,
                num_heads: int = 2, intermediate_size: int = 512, max_positions: int = 8192,
                seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 model sized for ``tokenizer`` (head_dim = hidden / heads = 64). Positions are
    rotary (no weights), so ``max_positions`` costs nothing; 8192 fits Search-R1's lengths (4096 + 500)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    return Qwen2ForCausalLM(config)


def save_tiny_model(out_dir: str | Path, texts: Iterable[str], vocab_size: int = 2048, **model_kwargs) -> Path:
    """Train a tokenizer on ``texts``, build a random model, save both to ``out_dir``."""
    out = Path(out_dir)
    tokenizer = train_tokenizer(texts, vocab_size)
    model = build_model(tokenizer, **model_kwargs)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
