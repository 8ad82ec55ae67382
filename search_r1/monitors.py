"""The search task's health alarms: patterns in what the policy writes that announce a collapse or a gamed reward
before the score shows it (docs/design.md, "Monitors").

Each is a ``verl.trainer.alarms.RowShare``: the share of a step's trajectory records (``verl.utils.rollout_log``)
that show the pattern, logged every step as ``monitor/<name>``, firing when its mean over the last
``trainer.alarm_window`` steps is above its ``monitors.*`` setting. They read
the record's text: its policy segments (the ``<think>`` blocks), inserted segments (the passages), ``queries``,
``answer`` and the question in ``input``. ``alarms(cfg)`` (which ``search_r1.recipe`` exports as the recipe module's
``alarms``) adds to them ``score_without_retrieval``: the score rising while ``reward/retrieval_hit`` (a search found
a passage holding a gold answer: the recall signal) falls.

What counts, per trajectory (the constants below are the definitions; the settings are the shares that fire):

* ``repeated_ngrams``: a policy turn of at least ``MIN_NGRAMS`` word ``NGRAM``-grams of which at least
  ``REPEATED_SHARE`` repeat an earlier one of the turn (degenerate text: "the the the", a looping sentence).
* ``think_empty_or_copied``: a ``<think>`` block that is empty or is the question (after normalisation): reasoning
  that stopped while the format survives. A think repeated from turn to turn is not counted: ``make demo-real``'s
  cold start writes "I need to search for this." before every search (5 of the 24 rows of its first GRPO step
  repeat a think), healthy as it is.
* ``hedged_answers``: an answer that lists candidates: parts separated by " or ", ";", "/", "|" or a line break
  (two or more), or by commas (three or more; "Paris, France" is one answer). Exact match is gamed this way ("A or
  B or C" holds the gold answer for sub-EM and judges).
* ``copied_answers``: an answer of at least ``COPY_MIN_WORDS`` words that is the question or holds it (or that the
  question holds), or one of at least ``PASSAGE_MIN_WORDS`` words found whole in a passage the trajectory read.
* ``repeated_queries``: the same query (normalised) sent twice in one trajectory: the search loop gets nothing new.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from search_r1.config import SearchConfig
from search_r1.reward.qa_em import normalize_answer
from verl.trainer.alarms import Alarm, RowShare, ScoreVsSignal

Row = dict  # one trajectory record (verl.utils.rollout_log)

NGRAM, MIN_NGRAMS, REPEATED_SHARE = 4, 8, 0.5
COPY_MIN_WORDS, PASSAGE_MIN_WORDS = 4, 8
RECALL_SIGNAL = "reward/retrieval_hit"  # search_r1.reward.terms: a search retrieved a passage holding a gold answer

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_HEDGE = re.compile(r"\s+or\s+|[;/|\n]", re.IGNORECASE)


def _norm(text: str) -> str:
    return normalize_answer(text)  # lower case, no punctuation or articles (the reward's squad normalisation)


def policy_texts(row: Row) -> list[str]:
    """The texts of the row's policy turns (its ``segments`` of kind policy; the whole output when not recorded)."""
    segments = row.get("segments")
    if not segments:
        return [str(row.get("output") or "")]
    return [segment["text"] for segment in segments if segment["kind"] == "policy"]


def passages(row: Row) -> str:
    """The text the environment inserted into the row (its retrieved passages), normalised."""
    return _norm(" ".join(s["text"] for s in row.get("segments") or [] if s["kind"] == "inserted"))


def question(row: Row) -> str:
    """The question of the row's prompt (the line after its last "Question:"; the prompt's last line without one),
    normalised."""
    prompt = str(row.get("input") or "").rsplit("Question:", 1)[-1].strip()
    return _norm(prompt.splitlines()[0] if prompt else "")


def repeated_ngrams(row: Row) -> bool:
    """A policy turn whose word n-grams mostly repeat earlier ones of the turn."""
    for text in policy_texts(row):
        words = text.split()
        grams = [tuple(words[i:i + NGRAM]) for i in range(len(words) - NGRAM + 1)]
        if len(grams) >= MIN_NGRAMS and 1 - len(set(grams)) / len(grams) >= REPEATED_SHARE:
            return True
    return False


def think_empty_or_copied(row: Row) -> bool:
    """A think block that is empty or the question."""
    asked = question(row)
    return any(not think or think == asked for text in policy_texts(row) for think in map(_norm, _THINK.findall(text)))


def hedged_answer(row: Row) -> bool:
    """An answer listing several candidates."""
    answer = row.get("answer")
    if not answer:
        return False
    parts = [part for part in _HEDGE.split(answer) if part.strip()]
    listed = [part for part in answer.split(",") if part.strip()]
    return len(parts) >= 2 or len(listed) >= 3


def copied_answer(row: Row) -> bool:
    """An answer that copies the question or a whole passage."""
    answer = _norm(row.get("answer") or "")
    words = len(answer.split())
    if words >= COPY_MIN_WORDS:
        asked = question(row)
        if asked and (answer in asked or asked in answer):
            return True
    return words >= PASSAGE_MIN_WORDS and answer in passages(row)


def repeated_query(row: Row) -> bool:
    """The same query twice in the trajectory."""
    queries = [_norm(str(query)) for query in row.get("queries") or []]
    return len(set(queries)) < len(queries)


LR = "lower actor_rollout_ref.actor.optim.lr and resume from a checkpoint before it began"

# name -> (shows(row), its setting, what the rows show, what to do)
PATTERNS: dict[str, tuple[Callable[[Row], bool], str, str, str]] = {
    "repeated_ngrams": (repeated_ngrams, "repetition_above", "repeat themselves within a turn (degenerate text)",
                        f"the policy's text is degenerating (Search-R1 #186). What to do: {LR}"),
    "think_empty_or_copied": (think_empty_or_copied, "think_above", "have an empty <think> or one that is the question",
                              f"the reasoning has collapsed while the format survives. What to do: {LR}"),
    "hedged_answers": (hedged_answer, "hedge_above", "answer with several candidates (A or B or C)",
                       "the policy games the score by listing candidates. What to do: score with em, not subem or a "
                       "lenient judge, or add a term against lists to reward.terms; resume from before it began"),
    "copied_answers": (copied_answer, "copy_above", "answer with the question or a whole passage copied",
                       "the policy games a lenient score (sub-EM, F1, a judge) with long answers. What to do: score "
                       "with em, and resume from before it began"),
    "repeated_queries": (repeated_query, "repeated_queries_above", "send the same query twice",
                         f"the search loop brings nothing new (Agent-R1 #8). What to do: {LR}; a format or "
                         "retrieval_hit reward term helps"),
}


def alarms(cfg: SearchConfig) -> list[Alarm]:
    """The search task's alarms for ``cfg`` (its ``monitors.*`` and ``trainer.alarm_*`` thresholds)."""
    m, t = cfg.monitors, cfg.trainer
    found: list[Alarm] = [RowShare(name, shows, getattr(m, key), t.alarm_window, f"monitors.{key}", what, advice)
                          for name, (shows, key, what, advice) in PATTERNS.items()]
    return found + [ScoreVsSignal("score_without_retrieval", RECALL_SIGNAL, t.alarm_score_rise, t.alarm_signal_drop,
                                  t.alarm_baseline_steps, t.alarm_window)]
