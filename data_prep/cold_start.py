"""Trajectories for the supervised cold start (``python -m verl.trainer.main_sft``), written as SFT parquet.

``python -m data_prep.cold_start scripted --data train.parquet --retriever-url URL --out sft.parquet``: a scripted
searcher over the user's QA parquet (the RL schema, ``data_prep.qa_search``) and their retrieval service.
``python -m data_prep.cold_start rft --model DIR ...``: rejection-sampled rollouts of a policy (``data_prep.rft``).
``python -m data_prep.cold_start teacher --teacher-url URL ...``: a teacher model behind an OpenAI-compatible chat
server, kept by exact match (``data_prep.teacher``).

A row is the question's RL row (prompt, gold answers, data source, index: ``qa_search.PARQUET_SCHEMA``) plus
``turns``: the response in order, ``[{text, sampled}]`` (sampled = the policy's text, trained; otherwise a block the
loop inserts, rendered exactly as the loop renders it: ``data_prep.turns``); ``data_prep.sft_rows``.
Every source prints one summary line: trajectories kept (and how) and dropped (and why).

Choices (the scripted searcher):
- Search, read, answer: the first query is the question itself; if a retrieved passage holds a gold answer
  (the reward's normaliser, token-aligned: ``reward.terms.contains``), the trajectory answers with that gold
  answer. Otherwise it tries bridge entities, for two-hop questions: the capitalised names in the passages that
  the question does not mention, in the order they appear (Doc 1 first), at most ``--max-bridges``; the first
  whose passages hold a gold answer becomes the second search. ``--rephrase N``: then up to N phrases of the
  question itself (runs of its content words: ``rephrasings``), the first that finds a gold answer searched
  second, so the policy sees that a search which failed is followed by another query, not by a guess (with the
  question as the only first query, a GRPO group's samples all sent the same query: docs/results.md, "The paper's
  table"). ``--phrase-first SHARE`` (with ``--rephrase N``): for that share of the questions (``phrase_first_chosen``:
  by a hash of the question, so the same ones on every build) the first query is the first of its N phrases whose
  passages hold a gold answer, where one does: a cold start whose first queries are of two kinds, so that a policy
  sampling from it sends a group different queries, which GRPO can compare (with one kind, a sampled group's
  retrieval differed for 1 of 60 questions, docs/results.md). Every other question is dropped, and counted with its
  reason: a trajectory whose passages do not support its answer would teach the policy to guess.
- The policy's text says what it does in a few plain words (``data_prep.turns``: ``SEARCH``, ``BRIDGE``,
  ``REPHRASE``, ``ANSWER``): the cold start teaches the protocol (tags, when to search, copying the answer out of
  the passages), not a style of reasoning.
- The question is read back from the prompt with the template the QA parquet was made with (``--template``,
  default ``search_r1.prompts``); a prompt of another template is dropped, counted.
- ``--format hermes`` (``scripted`` and ``teacher``): the turns as tool calls in the policy's chat template
  (``data_prep.turns.HermesTurns``): rows written for one tokenizer's template, whose prompts show the search tool
  (the SFT row's ``tools``).
- The passages are the service's, at ``--topk`` (use the RL run's ``retriever.topk``); a block longer than the RL
  run's ``data.max_obs_length`` is cut there by the loop but not here: keep ``max_obs_length`` above the blocks
  (``verl.trainer.main_sft`` refuses trajectories longer than ``data.max_length``).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from data_prep.qa_search import template_file
from data_prep.rft import add_rft_args, rft_cold_start
from data_prep.sft_rows import SFT_SCHEMA, gold_answers, qa_fields, rows_to_sft_parquet, sft_row, summary
from data_prep.teacher import add_teacher_args, openai_chat, teacher_cold_start
from data_prep.turns import TAG_TURNS, HermesTurns, TagTurns
from search_r1.llm_agent.formatting import split_title
from search_r1.prompts import DEFAULT_TEMPLATE, make_prompt, question_of
from search_r1.reward.qa_em import DEFAULT_NORMALIZE, normalize_answer
from search_r1.reward.terms import contains
from verl.utils.dataset import DataError, read_rows

logger = logging.getLogger(__name__)

__all__ = ["SFT_SCHEMA", "HermesTurns", "TagTurns", "rows_to_sft_parquet", "scripted_cold_start", "sft_row"]

# A name: capitalised words (letters, digits, ' and -), joined by spaces; a leading article or pronoun is dropped.
_NAME = re.compile(r"[A-Z][\w'-]*(?: [A-Z][\w'-]*)*")
_LEADING = {"The", "A", "An", "It", "He", "She", "They", "In", "On", "At", "Of", "This", "That", "Its", "His", "Her"}

SearchFn = Callable[[list[str]], list[list[dict]]]  # queries -> per query, docs {"id", "contents"}


def gold_in(docs: list[dict], golds: list[str], normalize: str = DEFAULT_NORMALIZE) -> str | None:
    """The first gold answer that a passage of ``docs`` holds (token-aligned, normalised), else None."""
    return next((g for g in golds for d in docs if contains(d["contents"], g, normalize)), None)


def bridge_candidates(docs: list[dict], question: str, limit: int) -> list[str]:
    """Names in the passages (titles and texts, Doc 1 first) that the question does not mention, at most
    ``limit``."""
    asked = f" {normalize_answer(question)} "
    out: list[str] = []
    for doc in docs:
        title, text = split_title(doc["contents"])
        for name in _NAME.findall(f"{title}. {text}"):
            words = name.split(" ")
            while words and words[0] in _LEADING:
                words = words[1:]
            name = " ".join(words)
            key = normalize_answer(name)
            if key and f" {key} " not in asked and name not in out:
                out.append(name)
    return out[:limit]


# Question words and function words: left out of a rephrased query, whose words are the question's others.
_NOT_CONTENT = frozenset("who whom whose what when where which why how is are was were did does do done the a an of in "
                         "on at to for by with from and or as that this these those it its be been being has have had "
                         "first last name named called".split())
_WORD = re.compile(r"[\w'-]+")
_RUN_LENGTHS = (3, 2, 4, 1)  # words in a rephrased query, tried in this order


def rephrasings(question: str, limit: int) -> list[str]:
    """Runs of the question's content words (``_NOT_CONTENT`` left out), to search instead of the question: every run
    of three words in the question's order, then of two, four and one; at most ``limit``, none repeated. NQ's
    questions are lower case, so names cannot be told from other words by their letters: the service decides which
    run finds a passage."""
    words = [w for w in _WORD.findall(question.lower()) if w not in _NOT_CONTENT]
    out: list[str] = []
    for n in _RUN_LENGTHS:
        for start in range(len(words) - n + 1):
            run = " ".join(words[start:start + n])
            if run not in out:
                out.append(run)
    return out[:limit]


def phrase_first_chosen(question: str, share: float) -> bool:
    """Whether ``question`` is one of the ``share`` (0-1) of questions searched first by a phrase of it: its text's
    sha256 read as a fraction below ``share``, so a build chooses the same questions whatever the rows' order."""
    return int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big") / 2**64 < share


@dataclass
class Scripted:
    """One question's outcome: its turns, or why it was dropped."""

    turns: list[dict] | None
    reason: str  # one_search | two_searches | rephrased | phrase_first | no question in prompt | no gold answer in the
    # passages


SECOND = {"bridge": "two_searches", "rephrase": "rephrased"}  # why the second search was made -> the outcome counted


def script_searches(questions: list[str | None], golds: list[list[str]], search: SearchFn,
                    max_bridges: int, write: TagTurns = TAG_TURNS, max_rephrasings: int = 0,
                    phrase_first: float = 0.0) -> list[Scripted]:
    """Search each question (and, for the ``phrase_first`` share of them, up to ``max_rephrasings`` phrases of it, the
    first that finds a gold answer searched instead), then (where its passages hold no gold answer) its bridge
    candidates and then its phrases, the first that finds a gold answer kept; one request per round for all
    questions. ``write`` renders the turns (the action format)."""
    out = [Scripted(None, "no question in prompt") for _ in questions]
    asked = [i for i, q in enumerate(questions) if q is not None]
    chosen = {i for i in asked if phrase_first_chosen(questions[i], phrase_first)}
    firsts = [(i, questions[i]) for i in asked]  # (question, query); then the chosen questions' phrases, in order
    firsts += [(i, p) for i in asked if i in chosen for p in rephrasings(questions[i], max_rephrasings)]
    first: dict[int, list[dict]] = {}
    phrase: dict[int, dict] = {}  # question -> the turns of its first phrase whose passages hold a gold answer
    for (i, query), docs in zip(firsts, search([q for _, q in firsts]) if firsts else [], strict=True):
        if i not in first:
            first[i] = docs
        elif i not in phrase and (answer := gold_in(docs, golds[i])) is not None:
            phrase[i] = [write.search(query), write.passages(docs), write.answer(answer)]
    second: list[tuple[int, str, str]] = []  # (question, why, query), in the order they are preferred
    for i, docs in first.items():
        if i in phrase:
            out[i] = Scripted(phrase[i], "phrase_first")
            continue
        answer = gold_in(docs, golds[i])
        if answer is not None:
            out[i] = Scripted([write.search(questions[i]), write.passages(docs), write.answer(answer)], "one_search")
            continue
        out[i] = Scripted(None, "no gold answer in the passages")
        second += [(i, "bridge", b) for b in bridge_candidates(docs, questions[i], max_bridges)]
        if i not in chosen:  # a chosen question's phrases were searched first, and missed
            second += [(i, "rephrase", p) for p in rephrasings(questions[i], max_rephrasings)]
    results = search([query for _, _, query in second]) if second else []
    for (i, why, query), docs in zip(second, results, strict=True):
        answer = gold_in(docs, golds[i])
        if out[i].turns is None and answer is not None:
            out[i] = Scripted([write.search(questions[i]), write.passages(first[i]), write.search(query, why),
                               write.passages(docs), write.answer(answer)], SECOND[why])
    return out


def scripted_cold_start(data: str, search: SearchFn, template: str = DEFAULT_TEMPLATE,
                        max_bridges: int = 3, write: TagTurns = TAG_TURNS,
                        max_rephrasings: int = 0, phrase_first: float = 0.0) -> tuple[list[dict], Counter]:
    """SFT rows of the scripted searcher over the QA parquet ``data`` -> (rows kept, outcome counts). ``write``: the
    action format (``HermesTurns``: the prompts are made again under its template, and show its tools)."""
    rows = read_rows(data, required=("prompt", "reward_model"))
    questions, golds = [], []
    for i, row in enumerate(rows):
        prompt = row["prompt"]
        if not isinstance(prompt, list) or not prompt or not isinstance(prompt[-1], dict):
            raise DataError(f"row {i} of {data!r}: column 'prompt' must be a non-empty list of chat messages")
        content = str(prompt[-1].get("content", ""))  # made from --template, or already in the format's template
        questions.append(question_of(content, template) or question_of(content, write.template))
        golds.append(gold_answers(row))
        if not golds[-1]:
            raise DataError(f"row {i} of {data!r}: no gold answer in reward_model.ground_truth.target")
    outcomes = script_searches(questions, golds, search, max_bridges, write, max_rephrasings, phrase_first)
    kept = []
    for i, (row, outcome) in enumerate(zip(rows, outcomes, strict=True)):
        if outcome.turns is not None:
            qa = qa_fields(row, i)
            if write.template != template:
                qa["prompt"] = [*qa["prompt"][:-1], {**qa["prompt"][-1], "content": make_prompt(questions[i],
                                                                                               write.template)}]
            kept.append(sft_row(qa, outcome.turns, write.tools))
    return kept, Counter(o.reason for o in outcomes)


def _count(text: str) -> int:
    """An argparse type: a whole number >= 0 (argparse names the option; this, the value and what is allowed)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def _share(text: str) -> float:
    """An argparse type: a fraction from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share from 0 to 1")
    return value


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m data_prep.cold_start", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="source", required=True)
    scripted = sub.add_parser("scripted", help="a scripted searcher over your QA parquet and retrieval service")
    rft = sub.add_parser("rft", help="rejection-sampled rollouts of a policy (keep exact matches)")
    teacher = sub.add_parser("teacher", help="a teacher model behind an OpenAI-compatible chat server (keep exact "
                             "matches)")
    for p in (scripted, rft, teacher):
        p.add_argument("--data", required=True, help="QA parquet (Search-R1 schema, e.g. from data_prep.qa_search)")
        p.add_argument("--retriever-url", required=True, help="the retrieval service (as retriever.url)")
        p.add_argument("--topk", type=int, default=3, help="passages per search (retriever.topk of the RL run)")
        p.add_argument("--out", required=True, type=Path, help="SFT parquet to write")
    scripted.add_argument("--template", type=Path, metavar="PATH",
                          help="the prompt template the QA parquet was made with (to read the question back)")
    for p in (scripted, teacher):
        p.add_argument("--format", choices=["search_r1", "hermes"], default="search_r1",
                       help="action format (actor_rollout_ref.rollout.multi_turn.format of the RL run); hermes "
                       "renders the turns with --tokenizer's chat template")
        p.add_argument("--tokenizer", metavar="DIR", help="--format hermes: the policy's tokenizer (its chat "
                       "template renders the tool messages)")
    scripted.add_argument("--max-bridges", type=_count, default=3,
                          help="bridge entities tried when the question's passages hold no gold answer (0 = none)")
    scripted.add_argument("--rephrase", type=_count, default=0, metavar="N",
                          help="then up to N phrases of the question (runs of its content words) tried as the second "
                          "search (default 0: none)")
    scripted.add_argument("--phrase-first", type=_share, default=0.0, metavar="SHARE",
                          help="for this share of the questions (0-1, chosen by a hash of the question), search first "
                          "the first of the --rephrase N phrases that finds a gold answer, where one does (default 0)")
    add_rft_args(rft)
    add_teacher_args(teacher)
    args = parser.parse_args(argv)
    if args.source == "scripted" and args.phrase_first and not args.rephrase:
        scripted.error(f"--phrase-first {args.phrase_first} searches phrases of the question: give --rephrase N "
                       "(N > 0), how many phrases to try")
    return args


def _turn_writer(args: argparse.Namespace) -> TagTurns:
    """The turns of ``--format``; hermes needs ``--tokenizer`` (ValueError naming it otherwise)."""
    if args.format == "search_r1":
        return TagTurns()
    if not args.tokenizer:
        raise ValueError("--format hermes needs --tokenizer DIR: the policy's tokenizer, whose chat template renders "
                         "the tool messages")
    from transformers import AutoTokenizer

    return HermesTurns(AutoTokenizer.from_pretrained(args.tokenizer))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0, or 2 with ``error: ...`` naming the bad file, row or service."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    teacher_errors: tuple[type[BaseException], ...] = ()
    if args.source == "teacher":  # only the teacher needs the openai package
        from openai import OpenAIError
        teacher_errors = (OpenAIError,)

    from search_r1.search.client import RetrievalClient, RetrievalError

    try:
        if args.source == "rft":
            rows, counts = rft_cold_start(args)
        else:
            write = _turn_writer(args)
            client = RetrievalClient(args.retriever_url, topk=args.topk, outage_timeout_s=30.0)
            client.check_health()
            if args.source == "scripted":
                template = template_file(args.template)["template"] if args.template else DEFAULT_TEMPLATE
                rows, counts = scripted_cold_start(args.data, client.search, template,
                                                   args.max_bridges, write, args.rephrase, args.phrase_first)
            else:
                rows, counts = teacher_cold_start(args, openai_chat(args, write), client.search, write)
        if not rows:
            raise ValueError(f"no trajectory kept of {sum(counts.values())} questions ({dict(counts)}): nothing to "
                             "write")
        rows_to_sft_parquet(rows, args.out)
    except (DataError, RetrievalError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except teacher_errors as err:  # the teacher's server: not answering, or refusing the request
        print(f"error: the teacher at --teacher-url {args.teacher_url} failed: {err}", file=sys.stderr)
        return 2
    print(summary(counts, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
