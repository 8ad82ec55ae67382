"""The real-vocabulary tokenizer built from the shipped Qwen BPE ranks: known Qwen2.5 ids, tiktoken parity,
chat template, special tokens, the on-disk cache."""

from __future__ import annotations

import random
import unicodedata

import pytest
import tiktoken

from data_prep.qwen_tokenizer import (
    ADDED_TOKENS,
    MODEL_VOCAB_SIZE,
    PRETOKENIZE_REGEX,
    VOCAB_SIZE,
    build_qwen_tokenizer,
    load_ranks,
    ranks_path,
)
from search_r1.llm_agent.formatting import INFO_CLOSE, INFO_OPEN, INVALID_ACTION_FEEDBACK
from search_r1.prompts import make_prompt

# Known Qwen2.5 ids, each published by someone who ran the official Qwen tokenizer.
KNOWN_IDS = [
    # huggingface/transformers, tests/models/qwen2/test_tokenization_qwen2.py, test_tokenizer_integration
    # (Qwen/Qwen-tokenizer, the vocabulary Qwen2/Qwen2.5 share; commit 04bee35c of that file): the three sequences
    # and their expected input_ids without the padding.
    ("Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
     "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
     "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
     "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
     [8963, 388, 320, 69514, 3881, 438, 4510, 27414, 32852, 388, 323, 4510, 27414, 21334, 35722, 1455, 529, 8,
      5707, 4586, 58238, 77235, 320, 61437, 11, 479, 2828, 12, 17, 11, 11830, 61437, 64, 11, 1599, 10994, 11,
      27604, 321, 33, 529, 11, 29881, 6954, 32574, 369, 18448, 11434, 45451, 320, 45, 23236, 8, 323, 18448, 11434,
      23470, 320, 30042, 38, 8, 448, 916, 220, 18, 17, 10, 80669, 4119, 304, 220, 16, 15, 15, 10, 15459, 323,
      5538, 94130, 2897, 1948, 619, 706, 11, 5355, 51, 21584, 323, 94986, 13]),
    ("🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。"
     "使用预训练模型可以减少计算消耗和碳排放，并且节省从头训练所需要的时间和资源。",
     [144834, 80532, 93685, 83744, 34187, 73670, 104261, 29490, 62189, 103937, 104034, 102830, 98841, 104034,
      104949, 9370, 5333, 58143, 102011, 1773, 37029, 98841, 104034, 104949, 73670, 101940, 100768, 104997, 33108,
      100912, 105054, 90395, 100136, 106831, 45181, 64355, 104034, 113521, 101975, 33108, 85329, 1773]),
    ('```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\ntokenizer("世界，你好！")```',
     [73594, 12669, 198, 85593, 284, 8979, 37434, 6387, 10442, 35722, 445, 48, 16948, 45274, 16948, 34841, 3135,
      1138, 85593, 445, 99489, 3837, 108386, 6313, 899, 73594]),
    # alibaba/rtp-llm, rtp_llm/test/tokenizer_test/qwen2_tokenizer_test.py: special tokens inside text.
    ("<|im_start|>hello<|im_end|>", [151644, 14990, 151645]),
]

# Qwen2.5-Instruct's chat template output, default system prompt included. Sources (public pages found through
# the search tool's code corpus; their repositories are not named there): a Qwen2.5-0.5B-Instruct reference
# fixture listing the prompt ids of "What is the capital of France?" (case "short"), and a post showing
# `AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct").apply_chat_template(messages, return_dict=False)`
# for a user turn "What's 2+2?" and an assistant turn "4.".
SYSTEM_IDS = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264, 10950,
              17847, 13, 151645, 198]
KNOWN_CHATS = [
    ([{"role": "user", "content": "What is the capital of France?"}], True,
     SYSTEM_IDS + [151644, 872, 198, 3838, 374, 279, 6722, 315, 9625, 30, 151645, 198, 151644, 77091, 198]),
    ([{"role": "user", "content": "What's 2+2?"}, {"role": "assistant", "content": "4."}], False,
     SYSTEM_IDS + [151644, 872, 198, 3838, 594, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198, 19, 13,
                   151645, 198]),
]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("text, ids", KNOWN_IDS)
def test_known_qwen_ids(qwen_tokenizer, text, ids):
    """Guards against a vocabulary, merge order, regex split or added-token table that differs from Qwen2.5's."""
    assert encode(qwen_tokenizer, text) == ids
    assert qwen_tokenizer.decode(ids) == text


@pytest.mark.parametrize("messages, generation_prompt, ids", KNOWN_CHATS)
def test_chat_template_matches_qwen25_instruct(qwen_tokenizer, messages, generation_prompt, ids):
    """Guards against a chat template that renders differently from Qwen2.5-Instruct's (default system prompt,
    newlines, generation prompt), which would put real checkpoints off-distribution."""
    out = qwen_tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True,
                                             return_dict=False)
    assert out == ids


def test_explicit_system_prompt_replaces_the_default(qwen_tokenizer):
    """Guards against the default system prompt being added on top of the caller's own."""
    text = qwen_tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                              tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")


def _texts() -> list[str]:
    """Project texts plus random strings mixing ASCII, accents, CJK, emoji, digits and whitespace runs."""
    rng = random.Random(0)
    pools = [(32, 127), (0xC0, 0x17F), (0x4E00, 0x9FFF), (0x1F300, 0x1F6FF), (0x300, 0x36F)]
    texts = [make_prompt("Who wrote Hamlet?"), INFO_OPEN + "Doc 1(Title: Paris) Paris is…" + INFO_CLOSE,
             INVALID_ACTION_FEEDBACK, "</search>\n\n", "  \t\n\r\n  x  \n", "1234567 3.14159 -42", "don't I'LL we've"]
    for _ in range(200):
        chars = []
        for _ in range(rng.randrange(1, 60)):
            lo, hi = rng.choice(pools)
            chars.append(chr(rng.randrange(lo, hi)) if rng.random() < 0.8 else rng.choice(" \n\t'"))
        texts.append("".join(chars))
    return texts


def test_matches_tiktoken_on_the_same_ranks(qwen_tokenizer):
    """Guards against merges derived from the ranks in a way that makes HF's BPE disagree with Qwen's own
    rank-greedy BPE (tiktoken with Qwen's regex), and against lossy decoding."""
    reference = tiktoken.Encoding("qwen-ranks", pat_str=PRETOKENIZE_REGEX, mergeable_ranks=load_ranks(ranks_path()),
                                 special_tokens={})
    for text in _texts():
        nfc = unicodedata.normalize("NFC", text)  # Qwen2.5 normalises with NFC before splitting
        ids = encode(qwen_tokenizer, text)
        assert ids == reference.encode_ordinary(nfc), text
        assert qwen_tokenizer.decode(ids) == nfc


def test_vocabulary_and_special_tokens(qwen_tokenizer):
    """Guards against ids, eos/pad or special flags that differ from Qwen2.5-Instruct's tokenizer_config."""
    assert len(qwen_tokenizer) == VOCAB_SIZE == 151_665 < MODEL_VOCAB_SIZE
    for offset, (content, _) in enumerate(ADDED_TOKENS):
        assert qwen_tokenizer.convert_tokens_to_ids(content) == 151_643 + offset
    assert qwen_tokenizer.eos_token == "<|im_end|>" and qwen_tokenizer.eos_token_id == 151_645
    assert qwen_tokenizer.pad_token == "<|endoftext|>" and qwen_tokenizer.pad_token_id == 151_643
    assert qwen_tokenizer.bos_token is None
    ids = encode(qwen_tokenizer, "<|im_start|>a<tool_call>b<|video_pad|><|file_sep|><|im_end|>")
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == "a<tool_call>b<|file_sep|>"


def test_search_tags_are_several_tokens_and_merge_with_what_follows(qwen_tokenizer):
    """The property the real-vocabulary agent tests rely on (if it stopped holding they would test nothing new):
    ``</search>`` is three tokens, and its ``>`` merges with following newlines into one token."""
    tag = encode(qwen_tokenizer, "</search>")
    assert len(tag) == 3
    merged = encode(qwen_tokenizer, "</search>\n\n")
    assert merged[:2] == tag[:2] and len(merged) == 3 and qwen_tokenizer.decode(merged[2:]) == ">\n\n"
    assert encode(qwen_tokenizer, "</search>" + INFO_OPEN)[:3] == merged


def test_cache_is_keyed_and_reused(tmp_path):
    """Guards against rebuilding on every call (slow tests) and against a cache that a changed ranks file or
    build would not invalidate (the key holds the ranks' hash and the build version)."""
    first = build_qwen_tokenizer(tmp_path)
    (entry,) = list(tmp_path.iterdir())
    assert (entry / "tokenizer.json").is_file() and "-v" in entry.name
    stamp = (entry / "tokenizer.json").stat().st_mtime_ns
    second = build_qwen_tokenizer(tmp_path)
    assert (entry / "tokenizer.json").stat().st_mtime_ns == stamp
    assert encode(second, KNOWN_IDS[0][0]) == encode(first, KNOWN_IDS[0][0]) == KNOWN_IDS[0][1]
