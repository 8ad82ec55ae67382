"""Two runs, or two steps of one run, on the same questions: the questions one got right and the other wrong, and
the EM difference with its paired bootstrap 95% interval (docs/design.md, "Trajectory viewer").

Choices:

- Each side is one step of one split (an evaluation, one validation, one training step): a side whose files hold
  several is refused, naming them, so that ``--step`` / ``--split`` or a ``<step>.jsonl`` file picks one.
- Questions are matched by dataset row (``data_source`` and ``index``) when every trajectory of both sides records
  it, else by the question text. Questions on one side only are counted and left out.
- A question's EM on a side is the mean EM of its trajectories there (with k samples the expected EM of one
  sample, as ``search_r1.eval_report`` counts it); the side got it right when that is at least 0.5 (greedy: its one
  trajectory is an exact match).
- The difference is the mean over matched questions of EM(B) - EM(A). Its interval is ``eval_report.bootstrap_ci``
  of the per-question differences: a resample draws questions, each with both of its results, which is what makes
  the bootstrap paired (Efron and Tibshirani 1993, ch. 16; the usual test of two systems on one test set).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from search_r1.eval_report import bootstrap_ci
from search_r1.inspect.records import RIGHT, SAMPLE_SEED, InspectInputError, Loaded, Record


@dataclass
class Question:
    """One question both sides answered."""

    key: tuple
    text: str
    a: list[Record]
    b: list[Record]

    @property
    def em_a(self) -> float:
        return float(np.mean([r.em for r in self.a]))

    @property
    def em_b(self) -> float:
        return float(np.mean([r.em for r in self.b]))

    @property
    def change(self) -> str | None:
        """``fixed`` (A wrong, B right), ``broken`` (A right, B wrong) or None (the same verdict)."""
        right_a, right_b = self.em_a >= RIGHT, self.em_b >= RIGHT
        if right_a == right_b:
            return None
        return "fixed" if right_b else "broken"


@dataclass
class Comparison:
    a: Loaded
    b: Loaded
    matched_by: str  # "dataset row" or "question text"
    questions: list[Question]  # every matched question, in A's order
    only_a: int  # questions A answered and B did not
    only_b: int
    em_a: float  # mean over the matched questions
    em_b: float
    diff: float  # em_b - em_a
    ci: list[float]  # paired bootstrap 95% interval of diff

    def changed(self, change: str | None = None) -> list[Question]:
        """The questions ``change`` (``fixed`` or ``broken``) names; both with None."""
        return [q for q in self.questions if q.change is not None and change in (None, q.change)]

    def sample_changed(self, limit: int | None) -> list[Question]:
        """At most ``limit`` of the changed questions (a sample drawn with ``SAMPLE_SEED``, in A's order)."""
        changed = self.changed()
        if limit is None or len(changed) <= limit:
            return changed
        return [changed[i] for i in sorted(random.Random(SAMPLE_SEED).sample(range(len(changed)), limit))]

    def summary(self) -> str:
        """One line: both EMs, the difference and its interval, the question counts."""
        return (f"EM on {len(self.questions):,} questions matched by {self.matched_by}: A {self.em_a:.3f}, "
                f"B {self.em_b:.3f}; B - A = {self.diff:+.3f}, paired bootstrap 95% interval [{self.ci[0]:+.3f}, "
                f"{self.ci[1]:+.3f}]. Fixed by B (A wrong, B right): {len(self.changed('fixed'))}; broken by B "
                f"(A right, B wrong): {len(self.changed('broken'))}; only in A: {self.only_a}; only in B: "
                f"{self.only_b}.")


def _check_side(name: str, side: Loaded) -> None:
    kinds = sorted({(r.split, r.step) for r in side.records}, key=str)
    if len(kinds) > 1:
        shown = ", ".join(f"{split} step {step}" for split, step in kinds[:8]) + (", ..." if len(kinds) > 8 else "")
        raise InspectInputError(f"{name} ({side.source}) holds trajectories of {len(kinds)} steps ({shown}); compare "
                                "one with one: name it with --step N (and --split) or give one <step>.jsonl file")
    unscored = [r for r in side.records if r.em is None]
    if unscored:
        raise InspectInputError(
            f"{name} ({side.source}): {len(unscored)} of {len(side.records)} trajectories have no exact match to "
            f"compare (uid {unscored[0].uid}: no 'em' reward term and no gold answers recorded); compare files of the "
            "trajectory record or evaluations")


def compare(a: Loaded, b: Loaded) -> Comparison:
    """Match ``a``'s and ``b``'s questions and compare their EM (module docstring)."""
    for name, side in (("A", a), ("B", b)):
        _check_side(name, side)
    by_row = all(r.index is not None for r in (*a.records, *b.records))
    keyed: list[dict[tuple, list[Record]]] = []
    for side in (a, b):
        groups: dict[tuple, list[Record]] = defaultdict(list)
        for r in side.records:
            groups[(r.data_source, r.index) if by_row else (r.question,)].append(r)
        keyed.append(groups)
    groups_a, groups_b = keyed
    questions = [Question(k, rs[0].question, rs, groups_b[k]) for k, rs in groups_a.items() if k in groups_b]
    if not questions:
        raise InspectInputError(f"A ({a.source}) and B ({b.source}) share no question (matched by "
                                f"{'dataset row' if by_row else 'question text'}): compare runs on the same data")
    em_a = np.array([q.em_a for q in questions])  # [Q]
    em_b = np.array([q.em_b for q in questions])  # [Q]
    return Comparison(a, b, "dataset row" if by_row else "question text", questions,
                      only_a=len(groups_a) - len(questions), only_b=len(groups_b) - len(questions),
                      em_a=float(em_a.mean()), em_b=float(em_b.mean()), diff=float((em_b - em_a).mean()),
                      ci=bootstrap_ci(em_b - em_a))
