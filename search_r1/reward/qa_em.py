"""Rule-based rewards for open-domain QA: exact match (EM), sub-EM and token F1 of the final answer.

Choices:

- Normalisation (``normalize``, config key ``reward.normalize``) is one of ``NORMALIZERS``:
  ``squad`` (the default) is SQuAD's evaluation script exactly as Search-R1, FlashRAG and the
  published tables use it: lower case, ASCII punctuation (``string.punctuation``) removed, the
  articles a/an/the removed, whitespace squashed. Unicode punctuation is kept, so "—dash—" is not
  "dash". ``unicode`` is our stricter variant: Unicode NFKC first (composed and decomposed accents,
  full-width letters and ligatures compare equal; accents are *kept*, "Chávez" != "Chavez"), and
  every Unicode punctuation character (category P*, e.g. curly quotes, dashes) removed like ASCII
  punctuation. Scores are only comparable with published ones under ``squad``.
- The answer is the content of the last complete ``<answer>...</answer>`` block of the RESPONSE
  only; the prompt is never scored (its instruction contains an example answer), so no "needs two
  tags" rule is needed. Text inside ``<information>`` blocks (and, in the hermes action format, ``<tool_response>``
  blocks) was inserted by the environment, so an ``<answer>`` tag inside a retrieved passage or a tool's result is
  never taken as the policy's answer.
- Golden answers that normalise to the empty string (e.g. "The") are ignored: otherwise sub-EM
  would credit every prediction.
- Sub-EM asks whether a normalised golden answer occurs in the normalised prediction *as a whole
  token sequence* ("4" is not found in "1945"); FlashRAG's plain substring test would credit that.
- F1 is SQuAD's bag-of-tokens F1, maximised over the golden answers.
- ``compute_score`` picks the scorer from ``data_source`` (``DATA_SOURCE_SCORERS``, glob patterns
  allowed) with a default, and gives ``format_score`` to a well-formed trajectory whose answer is
  wrong (Search-R1's optional format reward).
"""

from __future__ import annotations

import fnmatch
import logging
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import numpy as np

logger = logging.getLogger(__name__)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
# Inserted blocks: the tag format's passages, the hermes format's tool results (the Hermes convention's wrapper)
_INFORMATION_BLOCK = re.compile(r"<(information|tool_response)>.*?(?:</\1>|\Z)", re.DOTALL)
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"


def _squash(s: str) -> str:
    """Remove the articles a/an/the and squash whitespace (the last two steps of SQuAD's recipe)."""
    return " ".join(_ARTICLES.sub(" ", s).split())


def normalize_squad(s: str) -> str:
    """SQuAD's recipe: lower case, drop ASCII punctuation and the articles a/an/the, squash whitespace."""
    return _squash("".join(ch for ch in s.lower() if ch not in _ASCII_PUNCT))


def normalize_unicode(s: str) -> str:
    """SQuAD's recipe after Unicode NFKC, dropping Unicode punctuation (category P*) as well as ASCII."""
    s = unicodedata.normalize("NFKC", s).lower()
    return _squash("".join(ch for ch in s if ch not in _ASCII_PUNCT and not unicodedata.category(ch).startswith("P")))


# reward.normalize -> normaliser; "squad" is the published recipe (the default).
NORMALIZERS: dict[str, Callable[[str], str]] = {"squad": normalize_squad, "unicode": normalize_unicode}
DEFAULT_NORMALIZE = "squad"


def normalize_answer(s: str, normalize: str = DEFAULT_NORMALIZE) -> str:
    """``s`` normalised by the ``normalize`` recipe (a key of ``NORMALIZERS``)."""
    _check_normalize(normalize)
    return NORMALIZERS[normalize](s)


def _check_normalize(name: str) -> None:
    if name not in NORMALIZERS:
        raise ValueError(f"unknown normalisation {name!r}; valid: {', '.join(sorted(NORMALIZERS))}")


def extract_answer(response: str) -> str | None:
    """Content (stripped) of the last complete ``<answer>...</answer>`` block of ``response``, else None.

    ``response`` must be the generated part only. Retrieved ``<information>`` and ``<tool_response>`` blocks are
    ignored.
    """
    policy_text = _INFORMATION_BLOCK.sub(" ", response)
    end = policy_text.rfind(_ANSWER_CLOSE)
    if end < 0:
        return None
    start = policy_text.rfind(_ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return policy_text[start + len(_ANSWER_OPEN):end].strip()


def golden_list(golden_answers: Iterable[str] | str, normalize: str) -> list[str]:
    """Golden answers as non-empty normalised strings (a str, list or numpy array of strings)."""
    answers = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    if not answers:
        raise ValueError("no golden answers to score against")
    normalised = [normalize_answer(str(a), normalize) for a in answers]
    return [a for a in normalised if a]


def em_check(prediction: str, golden_answers: Iterable[str] | str, normalize: str = DEFAULT_NORMALIZE) -> float:
    """1.0 if the normalised prediction equals a normalised golden answer, else 0.0."""
    pred = normalize_answer(prediction, normalize)
    return float(any(pred == gold for gold in golden_list(golden_answers, normalize)))


def subem_check(prediction: str, golden_answers: Iterable[str] | str, normalize: str = DEFAULT_NORMALIZE) -> float:
    """1.0 if a normalised golden answer occurs in the normalised prediction on token boundaries."""
    pred = f" {normalize_answer(prediction, normalize)} "
    return float(any(f" {gold} " in pred for gold in golden_list(golden_answers, normalize)))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    n_same = sum(common.values())
    if n_same == 0:
        return 0.0
    precision = n_same / len(pred_tokens)
    recall = n_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golden_answers: Iterable[str] | str, normalize: str = DEFAULT_NORMALIZE) -> float:
    """Max over golden answers of the token F1 between normalised prediction and golden answer."""
    pred_tokens = normalize_answer(prediction, normalize).split()
    golden = golden_list(golden_answers, normalize)
    return max((_token_f1(pred_tokens, gold.split()) for gold in golden), default=0.0)


_ANY_TAG = re.compile(r"</?(?:think|search|information|answer)>")
# One letter per block; a trajectory is turns of (think? search information) then think? answer.
_BLOCK_LETTER = {"think": "T", "search": "S", "information": "I", "answer": "A"}
_VALID_SEQUENCE = re.compile(r"(?:T?SI)*T?A")


def _block_sequence(response: str) -> str | None:
    """The blocks of ``response`` as letters (e.g. "TSITA"), or None if tags are unbalanced or nested,
    or non-whitespace text lies outside the blocks. Inside <information> only </information> counts."""
    letters, pos = [], 0
    while True:
        match = _ANY_TAG.search(response, pos)
        if match is None:
            return "".join(letters) if not response[pos:].strip() else None
        tag = match.group(0)
        if tag.startswith("</") or response[pos:match.start()].strip():
            return None  # stray closing tag, or text between blocks
        name = tag[1:-1]
        closing = f"</{name}>"
        end = response.find(closing, match.end())
        if end < 0:
            return None  # unclosed block
        if name != "information" and _ANY_TAG.search(response, match.end(), end):
            return None  # nested tag inside think/search/answer
        letters.append(_BLOCK_LETTER[name])
        pos = end + len(closing)


def is_valid_format(response: str) -> bool:
    """True for a well-formed trajectory: only whitespace outside blocks, no nested or unbalanced tags,
    every <search> followed directly by one <information>, <think> at most once before each action,
    and exactly one <answer> block, which is the last block."""
    sequence = _block_sequence(response)
    return sequence is not None and _VALID_SEQUENCE.fullmatch(sequence) is not None


# scorer(prediction, golden answers, normalize) -> score
SCORERS: dict[str, Callable[[str, Iterable[str] | str, str], float]] = {
    "em": em_check,
    "subem": subem_check,
    "f1": f1_score,
}

# data_source (exact name or glob pattern) -> scorer name.
DATA_SOURCE_SCORERS: dict[str, str] = {
    "nq": "em",
    "triviaqa": "em",
    "popqa": "em",
    "hotpotqa": "em",
    "2wikimultihopqa": "em",
    "musique": "em",
    "bamboogle": "em",
    "demo_*": "em",
}


def _scorer_name(data_source: str, default_scorer: str) -> str:
    if data_source in DATA_SOURCE_SCORERS:
        return DATA_SOURCE_SCORERS[data_source]
    for pattern, name in DATA_SOURCE_SCORERS.items():
        if fnmatch.fnmatchcase(data_source, pattern):
            return name
    return default_scorer


def _check_scorer(name: str) -> None:
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; valid scorers: {', '.join(sorted(SCORERS))}")


def ground_truth_answers(ground_truth: Mapping | Iterable[str] | str) -> list[str]:
    """The golden answers of a parquet ``reward_model.ground_truth`` ({"target": [...]}) or a list/str."""
    if isinstance(ground_truth, Mapping):
        if "target" not in ground_truth:
            raise ValueError(f"ground_truth dict has no 'target' key: keys {sorted(ground_truth)}")
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, np.ndarray):
        return [str(a) for a in ground_truth.ravel()]
    return [str(a) for a in ground_truth]


def compute_score(data_source: str, solution_str: str, ground_truth: Mapping | Iterable[str] | str,
                  extra_info: dict | None = None, *, default_scorer: str = "em", format_score: float = 0.0,
                  normalize: str = DEFAULT_NORMALIZE) -> float:
    """Reward of one trajectory; ``solution_str`` is the decoded RESPONSE (never the prompt).

    Score = scorer(answer, golden) when the response has an answer; a well-formed trajectory
    (``is_valid_format``) gets at least ``format_score``; no answer -> 0.0. ``normalize`` names the
    answer normalisation (``NORMALIZERS``, config key ``reward.normalize``). ``extra_info`` is accepted
    for the verl reward-function signature and unused.
    """
    _check_scorer(default_scorer)
    _check_normalize(normalize)
    name = _scorer_name(data_source, default_scorer)
    _check_scorer(name)
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    score = SCORERS[name](answer, ground_truth_answers(ground_truth), normalize)
    if format_score and is_valid_format(solution_str):
        return max(score, format_score)
    return score
