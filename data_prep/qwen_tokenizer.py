"""A real Qwen2.5 tokenizer built offline from the BPE ranks that a registry package ships.

No hub download is possible here, so the vocabulary comes from ``qwen.tiktoken`` inside the
``dashscope`` package (Apache-2.0): 151,643 lines ``base64(token bytes) rank``, the byte-level BPE
of Qwen (the same 151,643 regular tokens as Qwen2/Qwen2.5). From it this module builds, with the
``tokenizers`` library, the tokenizer Qwen2.5 publishes:

- Model: byte-level BPE. The vocabulary maps each token's bytes, written in the GPT-2 byte-to-
  unicode alphabet, to its rank (= its id). The merges are derived from the ranks, one per
  multi-byte token: the pair that BPE itself joins last when it builds the token from single bytes
  using only lower-ranked tokens. Ordered by the rank of the token they make, these merges make the
  HF BPE pick the same pair as tiktoken's rank-greedy BPE at every step.
- Normaliser NFC; pre-tokeniser: Qwen2's regex split (letters, single digits, punctuation runs
  with trailing newlines, whitespace) then byte-level mapping without a prefix space; decoder
  byte-level; ``clean_up_tokenization_spaces`` off. Decoding is therefore exact byte for byte.
- Added tokens 151643..151664 in Qwen2.5's order (``ADDED_TOKENS``): the first 14 special
  (skipped by ``skip_special_tokens``), the tool-call and FIM tokens not. ``len(tokenizer)`` is
  151,665; Qwen2.5 models pad the embedding to ``MODEL_VOCAB_SIZE`` rows.
- eos ``<|im_end|>`` and pad ``<|endoftext|>`` as Qwen2.5-Instruct; no bos.
- A ChatML chat template written here with Qwen2.5-Instruct's output format: a first system turn
  (Qwen2.5's default system prompt when the messages start without one), each message as
  ``<|im_start|>{role}\\n{content}<|im_end|>\\n``, and ``<|im_start|>assistant\\n`` for
  ``add_generation_prompt``. Tool calls are not rendered.

Deriving the merges takes a few seconds, so the built ``tokenizer.json`` is cached on disk under a
key made of the ranks file's SHA-256 and ``BUILD_VERSION``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

RANKS_PACKAGE = "dashscope"
RANKS_FILE = "resources/qwen.tiktoken"  # inside the package
NUM_RANKS = 151_643
# Bump when the build below changes: it is part of the cache key.
BUILD_VERSION = 1

# Qwen2's pre-tokenisation regex (the ``pat_str`` of its tiktoken encoding and the Split of its tokenizer.json).
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5's added tokens from id 151643 on: (content, special).
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
VOCAB_SIZE = NUM_RANKS + len(ADDED_TOKENS)  # 151,665 = len(tokenizer)
MODEL_VOCAB_SIZE = 151_936  # embedding rows of Qwen2.5-0.5B/1.5B/3B/7B (padded for efficient kernels)

DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system = '" + DEFAULT_SYSTEM_PROMPT + "' -%}{%- set rest = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' -}}"
    "{%- for message in rest -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def ranks_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``dashscope`` package (not imported: only located)."""
    spec = importlib.util.find_spec(RANKS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {RANKS_PACKAGE!r} package (which ships Qwen's BPE ranks) is not installed; "
                                "it is in the [dev] extra: `make install`")
    path = Path(next(iter(spec.submodule_search_locations))) / RANKS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {RANKS_PACKAGE!r} package")
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    """``qwen.tiktoken`` -> {token bytes: rank}; checks that the ranks are exactly 0..NUM_RANKS-1."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(NUM_RANKS)):
        raise ValueError(f"{path}: expected ranks 0..{NUM_RANKS - 1}, one per token")
    return ranks


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies.

    Bytes that are printable Latin-1 characters ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves;
    the other 68 take the characters U+0100, U+0101, ... in byte order (so ' ' -> 'Ġ', '\\n' -> 'Ċ').
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in alphabet]
    alphabet.update({b: chr(256 + i) for i, b in enumerate(others)})
    return alphabet


def _last_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts BPE joins last when it builds ``token`` from bytes with tokens ranked below ``rank``."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_at = rank, -1
        for i in range(len(parts) - 1):
            pair_rank = ranks.get(parts[i] + parts[i + 1], rank)
            if pair_rank < best_rank:
                best_rank, best_at = pair_rank, i
        if best_at < 0:
            raise ValueError(f"token {token!r} (rank {rank}) cannot be built from lower-ranked tokens")
        parts[best_at:best_at + 2] = [parts[best_at] + parts[best_at + 1]]
    return parts[0], parts[1]


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in the order of the rank of the token it makes."""
    return [_last_merge(token, rank, ranks) for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])
            if len(token) > 1]


def build_backend(ranks: dict[bytes, int]) -> Tokenizer:
    """The ``tokenizers`` pipeline of Qwen2.5 (see the module docstring), added tokens included."""
    alphabet = byte_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in derive_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    for content, special in ADDED_TOKENS:  # one at a time: ids follow the list order
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    ids = [tok.token_to_id(content) for content, _ in ADDED_TOKENS]
    if ids != list(range(NUM_RANKS, VOCAB_SIZE)):
        raise AssertionError(f"added tokens got ids {ids[0]}..{ids[-1]}, expected {NUM_RANKS}..{VOCAB_SIZE - 1}")
    return tok


def _default_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "search_r1_qwen_tokenizer"


def build_qwen_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The Qwen2.5(-Instruct) tokenizer as a ``PreTrainedTokenizerFast`` (built once, then read from the cache)."""
    path = ranks_path()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    tokenizer_json = cache / f"qwen2.5-{digest}-v{BUILD_VERSION}" / "tokenizer.json"
    if not tokenizer_json.is_file():
        tokenizer_json.parent.mkdir(parents=True, exist_ok=True)
        backend = build_backend(load_ranks(path))
        fd, partial = tempfile.mkstemp(dir=tokenizer_json.parent, suffix=".partial")
        os.close(fd)
        backend.save(partial)
        os.replace(partial, tokenizer_json)  # atomic: concurrent builders never read a half-written file
    special = [content for content, is_special in ADDED_TOKENS if is_special]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json), eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, bos_token=None, unk_token=None,
        additional_special_tokens=[t for t in special if t not in (EOS_TOKEN, PAD_TOKEN)],
        clean_up_tokenization_spaces=False, model_max_length=131_072,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
