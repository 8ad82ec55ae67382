"""Composable rewards: a reward is a weighted sum of named terms over finished trajectories (``reward.terms``).

A term is one registered function (``register_term``) over a batch of ``Trajectory`` records that returns, per
trajectory, an outcome score and optionally one score per policy turn. Terms: ``em``, ``subem``, ``f1`` (the
answer against the gold answers, as ``qa_em`` scores them), ``format`` (``qa_em.is_valid_format``),
``retrieval_hit``, ``grounding`` and ``judge``.

Choices:
- Turns come from the token masks, not from re-parsing text: policy turn ``k`` is the ``k``-th run of policy tokens
  (``response_mask * info_mask``), ``inserted[k]`` the run of inserted tokens after it (an ``<information>``
  block, or the invalid-action feedback), each decoded on its own. So per-turn scores line up with the turns
  ``verl.algorithms.turn_credit`` places them on.
- ``retrieval_hit``: per search turn, 1 when one of the passages it got back contains a gold answer (normalised as
  EM normalises, matched as a whole token sequence, as sub-EM matches) and no earlier turn of the trajectory had
  retrieved that passage; 0 for a search that found no such new passage; NaN (not scored) for a turn that did not
  search (the answer, an invalid action). Outcome: 1 if any search of the trajectory hit. It rewards finding
  evidence, whatever the final answer. Both restrictions are measured, not taste: scoring every turn with 0 for
  "did not search" put answering turns in the same GiGPO step groups as searching ones, and counting a passage
  again paid for repeating a search; with either, GRPO + turn credit learnt to search until ``max_turns`` and its
  test EM stayed at the warm start's (docs/results.md, "Learning signals").
- ``grounding``: 1 when the final answer is non-empty and occurs (same matching) in a passage the agent retrieved.
  Correct but ungrounded = answered from memory; both are logged (``reward/grounding``, ``reward/em_ungrounded``).
- ``judge``: a model behind an OpenAI-compatible ``/v1/completions`` endpoint (vLLM's server; ``reward.judge``)
  is asked whether the answer matches the gold answers; its reply is constrained to " yes" / " no" with vLLM's
  structured outputs (``structured_outputs.choice``); 1 for yes. Requests run concurrently, each with the
  configured timeout; an endpoint that does not answer is an error naming the URL (a reward must not silently
  turn into 0). Asked only when ``judge`` has a weight.
- ``reward.terms`` null (the default) keeps today's reward exactly: ``qa_em.compute_score`` (``default_scorer``,
  ``format_score``). Every cheap term is still computed and logged as ``reward/<term>`` every step.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
import numpy as np

from search_r1.llm_agent.hermes import parse_tool_calls
from search_r1.reward.qa_em import (
    em_check,
    extract_answer,
    f1_score,
    ground_truth_answers,
    is_valid_format,
    normalize_answer,
    subem_check,
)
from verl.algorithms.registry import Registry

if TYPE_CHECKING:
    from verl.protocol import Batch

_SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
_DOC = re.compile(r"(?:^|\n)Doc \d+\(Title: ")
# the hermes format's search results (search_r1.tools.format_hits), inside the tool messages' <tool_response> blocks
_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_HERMES_DOC = re.compile(r"(?:^|\n)Doc \d+ \(id: [^\n]*?, Title: ")
_QUESTION = re.compile(r"Question:\s*(.+)")


@dataclass
class Turn:
    action: str  # the policy's text of this turn
    inserted: str  # the environment's text after it ("" after the last turn)

    @property
    def query(self) -> str | None:
        """The query of the turn's search (its last ``<search>`` block), if the environment answered one."""
        found = _SEARCH.findall(self.action)
        if found and "<information>" in self.inserted:
            return found[-1].strip()
        if "<tool_response>" not in self.inserted:  # the hermes format: the turn's last search call that was answered
            return None
        searched = [c.arguments["query"] for c in parse_tool_calls(self.action)
                    if c.name == "search" and isinstance((c.arguments or {}).get("query"), str)]
        return searched[-1].strip() if searched else None

    @property
    def passages(self) -> list[str]:
        """The passages of the ``<information>`` block after this turn (none if the turn did not search); in the hermes
        format, of its search results' tool messages."""
        if "<information>" not in self.inserted:
            return [p.strip() for body in _TOOL_RESPONSE.findall(self.inserted) if _HERMES_DOC.match(body.strip())
                    for p in _HERMES_DOC.split(body.strip()) if p.strip()]
        body = self.inserted.split("<information>", 1)[1].split("</information>", 1)[0]
        return [p.strip() for p in _DOC.split(body) if p.strip()]


@dataclass
class Trajectory:
    turns: list[Turn]
    response: str  # the whole decoded response
    golden: list[str]
    data_source: str
    question: str | None = None

    @property
    def answer(self) -> str | None:
        return extract_answer(self.response)

    def passages(self) -> list[str]:
        return [p for turn in self.turns for p in turn.passages]


@dataclass
class TermScores:
    outcome: np.ndarray  # [B]
    turns: list[list[float]] | None = None  # per row, per policy turn; NaN = the turn is not scored


@dataclass
class Context:
    normalize: str = "squad"
    judge: object = None  # JudgeConfig (search_r1.config) when the judge term is used


TermFn = Callable[[list[Trajectory], Context], TermScores]
# The reward terms by name (``reward.terms``): this module's and any plug-in's (``register_term``); the config's
# allowed names are read from here (``search_r1.config``).
TERMS: Registry[TermFn] = Registry("reward term")


def register_term(name: str) -> Callable[[TermFn], TermFn]:
    """Decorator: register ``fn(trajectories, context) -> TermScores`` as the reward term ``name``."""
    def register(fn: TermFn) -> TermFn:
        TERMS.add(name, fn)
        return fn
    return register


def trajectories(batch: Batch, tokenizer, texts: Sequence[str]) -> list[Trajectory]:
    """One record per row: its turns from the masks (module docstring), its response text, gold answers, question."""
    policy = (batch["response_mask"] * batch["info_mask"]).bool()  # [B, R]
    real = batch["response_mask"].bool()
    out = []
    for i, text in enumerate(texts):
        ids, pol, rl = batch["responses"][i].tolist(), policy[i].tolist(), real[i].tolist()
        runs: list[tuple[bool, list[int]]] = []
        for tok, p, r in zip(ids, pol, rl, strict=True):
            if not r:
                break
            if runs and runs[-1][0] == p:
                runs[-1][1].append(tok)
            else:
                runs.append((p, [tok]))
        turns: list[Turn] = []
        for is_policy, toks in runs:
            decoded = tokenizer.decode(toks, skip_special_tokens=True)
            if is_policy:
                turns.append(Turn(decoded, ""))
            elif turns:
                turns[-1].inserted += decoded
        question = None
        if "prompts" in batch:
            prompt = tokenizer.decode(batch["prompts"][i][batch["attention_mask"][i, :batch["prompts"].shape[1]]
                                                          .bool()].tolist(), skip_special_tokens=True)
            found = _QUESTION.findall(prompt)
            question = found[-1].strip() if found else None
        out.append(Trajectory(turns, text, ground_truth_answers(batch["ground_truth"][i]),
                              str(batch["data_source"][i]), question))
    return out


def contains(passage: str, answer: str, normalize: str) -> bool:
    """``answer`` (normalised) occurs in ``passage`` (normalised) as a whole token sequence."""
    want = normalize_answer(answer, normalize).split()
    have = normalize_answer(passage, normalize).split()
    return bool(want) and any(have[j:j + len(want)] == want for j in range(len(have) - len(want) + 1))


def _answer_term(check) -> TermFn:
    def term(trajs: list[Trajectory], ctx: Context) -> TermScores:
        return TermScores(np.array([0.0 if t.answer is None else check(t.answer, t.golden, ctx.normalize)
                                    for t in trajs], dtype=np.float64))
    return term


register_term("em")(_answer_term(em_check))
register_term("subem")(_answer_term(subem_check))
register_term("f1")(_answer_term(f1_score))


@register_term("format")
def format_term(trajs: list[Trajectory], ctx: Context) -> TermScores:
    return TermScores(np.array([float(is_valid_format(t.response)) for t in trajs]))


@register_term("retrieval_hit")
def retrieval_hit(trajs: list[Trajectory], ctx: Context) -> TermScores:
    """Per search turn: a gold answer in a passage no earlier turn retrieved (module docstring); NaN elsewhere."""
    turns, outcome = [], []
    for t in trajs:
        seen: set[str] = set()
        row = []
        for turn in t.turns:
            if turn.query is None:
                row.append(float("nan"))
                continue
            new = [p for p in turn.passages if p not in seen]
            row.append(float(any(contains(p, g, ctx.normalize) for p in new for g in t.golden)))
            seen.update(turn.passages)
        turns.append(row)
        outcome.append(float(any(score == 1.0 for score in row)))
    return TermScores(np.array(outcome), turns)


@register_term("grounding")
def grounding(trajs: list[Trajectory], ctx: Context) -> TermScores:
    return TermScores(np.array([float(bool(t.answer) and any(contains(p, t.answer, ctx.normalize)
                                                              for p in t.passages())) for t in trajs]))


JUDGE_PROMPT = ("Question: {question}\nGold answers: {golden}\nPredicted answer: {answer}\n"
                "Does the predicted answer mean the same as one of the gold answers? Answer yes or no.\nAnswer:")


@register_term("judge")
def judge(trajs: list[Trajectory], ctx: Context) -> TermScores:
    """1 per trajectory whose answer the judge model says matches a gold answer (module docstring)."""
    cfg = ctx.judge
    if cfg is None or not cfg.url:
        raise ValueError("the judge term needs reward.judge.url (an OpenAI-compatible server, e.g. vLLM's)")
    url = cfg.url.rstrip("/") + "/v1/completions"

    def ask(t: Trajectory, client: httpx.Client) -> float:
        if not t.answer:
            return 0.0
        prompt = JUDGE_PROMPT.format(question=t.question or "(not given)", golden="; ".join(t.golden), answer=t.answer)
        body = {"model": cfg.model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
                "structured_outputs": {"choice": [" yes", " no"]}}
        try:
            response = client.post(url, json=body)
        except httpx.TransportError as e:
            raise RuntimeError(f"reward judge at {url} did not answer ({type(e).__name__}: {e})") from None
        if response.status_code != 200:
            raise RuntimeError(f"reward judge at {url} answered HTTP {response.status_code}: {response.text[:300]}")
        reply = response.json()["choices"][0]["text"].strip().lower()
        if not reply.startswith(("yes", "no")):
            raise RuntimeError(f"reward judge at {url} answered {reply!r}, neither yes nor no (does the server "
                               "support structured_outputs.choice? vLLM >= 0.12 does)")
        return float(reply.startswith("yes"))

    with httpx.Client(timeout=cfg.timeout_s) as client, ThreadPoolExecutor(cfg.max_concurrency) as pool:
        return TermScores(np.array(list(pool.map(lambda t: ask(t, client), trajs)), dtype=np.float64))


LOGGED = ("em", "subem", "f1", "format", "retrieval_hit", "grounding")  # computed and logged every step


@dataclass
class RewardDetails:
    """What the composite reward returns for a batch (``verl.trainer.reward.RewardManager`` reads it)."""

    scores: np.ndarray | None  # [B] the weighted sum; None = the recipe's plain score function decides
    row_terms: dict[str, np.ndarray] = field(default_factory=dict)  # reward/<term> -> [B]
    turn_scores: list[list[float]] | None = None  # per row, per policy turn (reward.turn_term)


class TermsReward:
    """``reward.terms`` / ``reward.turn_term`` / ``reward.judge`` over a generated batch."""

    def __init__(self, weights: dict[str, float] | None, turn_term: str | None, normalize: str, judge=None):
        for name in [*(weights or {}), *([turn_term] if turn_term else [])]:
            TERMS.get(name)  # unknown names fail here, listing the valid ones
        self.weights, self.turn_term, self.ctx = weights, turn_term, Context(normalize, judge)

    def __call__(self, batch: Batch, texts: Sequence[str], tokenizer) -> RewardDetails:
        trajs = trajectories(batch, tokenizer, texts)
        names = list(dict.fromkeys([*LOGGED, *(self.weights or {}), *([self.turn_term] if self.turn_term else [])]))
        results = {name: TERMS.get(name)(trajs, self.ctx) for name in names}
        row_terms = {f"reward/{name}": r.outcome for name, r in results.items()}
        row_terms["reward/em_ungrounded"] = results["em"].outcome * (1 - results["grounding"].outcome)
        scores = None
        if self.weights is not None:
            scores = sum((w * results[n].outcome for n, w in self.weights.items()), np.zeros(len(trajs)))
        turns = None
        if self.turn_term:
            turns = results[self.turn_term].turns or [[] for _ in trajs]
        return RewardDetails(None if scores is None else scores.astype(np.float32), row_terms, turns)
