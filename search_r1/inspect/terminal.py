"""``search-r1-inspect --text``: the page's content in a terminal, with rich (no browser or display needed).

A view prints the sample note, the filter counts and the list; ``--show ID`` prints one trajectory (by uid, or
by the list's id) with its turns, the inserted text marked ``[inserted by the environment: N tokens, no
gradient]``. A comparison prints the EM line and the questions that changed; ``--show qN`` prints both sides'
trajectories of question N side by side.
"""

from __future__ import annotations

from collections import Counter

from rich.columns import Columns
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from search_r1.inspect.compare import Comparison
from search_r1.inspect.page import fmt, turns_of
from search_r1.inspect.records import (
    OUTCOMES,
    SEARCHED,
    InspectInputError,
    Loaded,
    Record,
    describe_files,
    outcome,
    sample_note,
)

STYLE = {"right": "bold green", "wrong": "bold red", "unknown": "dim", "fixed": "bold green", "broken": "bold red"}
INSERTED_STYLE = "grey50 on grey11"


def _turns(r: Record) -> Text:
    text = Text()
    if any(s.kind == "unmarked" for s in r.segments):
        text.append("(this file records no token masks: inserted text is not marked)\n", style="yellow")
    for k, turn in enumerate(turns_of(r.segments), start=1):
        text.append(f"-- turn {k} --\n", style="bold blue")
        for seg in turn:
            if seg.kind == "inserted":
                if text.plain and not text.plain.endswith("\n"):
                    text.append("\n")
                text.append(f"[inserted by the environment: {fmt(seg.tokens)} tokens, no gradient]\n",
                            style="bold yellow")
                text.append(seg.text, style=INSERTED_STYLE)
                text.append("\n[end of inserted]\n", style="bold yellow")
            else:
                text.append(seg.text)
        text.append("\n")
    return text


def trajectory(r: Record) -> RenderableType:
    """One trajectory: facts, answer against the gold answers, prompt, turns, queries, reward terms."""
    facts = Table.grid(padding=(0, 2))
    policy = sum(s.tokens or 0 for s in r.segments if s.kind == "policy")
    for name, value in (("step", r.step), ("split", r.split), ("data source", r.data_source), ("dataset row", r.index),
                        ("stop reason", r.stop_reason), ("searches", r.num_searches), ("turns", r.turns),
                        ("response tokens", r.response_length),
                        ("policy tokens", policy if any(s.kind == "policy" for s in r.segments) else None),
                        ("tokens with no gradient", r.no_grad_tokens), ("score", r.score),
                        ("advantage", r.advantage), *sorted(r.reward_terms.items())):
        facts.add_row(Text(name, style="dim"), fmt(value))
    verdict = Text.assemble(("answer: ", "dim"), (repr(r.answer), "bold"), ("   gold: ", "dim"),
                            (" | ".join(r.ground_truth) if r.ground_truth is not None else "-"),
                            ("   ", ""), (r.outcome, STYLE[r.outcome]))
    queries = "not recorded" if r.queries is None else ("none" if not r.queries else
                                                         "\n".join(f"{i}. {q}" for i, q in enumerate(r.queries, 1)))
    body = Group(verdict, facts, Text("prompt", style="bold"), Text(r.input, style="dim"),
                 Text("turns", style="bold"), _turns(r), Text("queries", style="bold"), Text(queries))
    return Panel(body, title=Text(f"{r.uid}  (list id {r.key})"), title_align="left")


def _counts(label: str, values: list[str], order: tuple[str, ...]) -> str:
    counts = Counter(values)
    return f"{label}: " + ", ".join(f"{v} {counts[v]}" for v in order if counts[v])


def print_view(loaded: Loaded, limit: int | None, show: str | None, console: Console) -> None:
    """The list of ``loaded``'s trajectories, or with ``show`` the trajectories whose uid or list id it is."""
    records = loaded.records
    if show is not None:
        picked = [r for r in records if show in (r.uid, r.key)]
        if not picked:
            raise InspectInputError(f"--show {show}: no trajectory of the sample has that uid or list id (the list "
                                    "without --show prints them)")
        for r in picked:
            console.print(trajectory(r))
        return
    console.print(Text(f"Trajectories of {loaded.source}", style="bold"))
    console.print(sample_note(len(records), loaded.total, limit, "trajectories"))
    console.print(f"Files: {describe_files(loaded.files)}.")
    console.print(_counts("outcome", [r.outcome for r in records], OUTCOMES) + "; "
                  + _counts("searched", [r.searched_label for r in records], SEARCHED))
    table = Table("id", "step", "uid", "question", "answer", "EM", "score", "searches", "tokens", show_lines=False)
    for r in records:
        table.add_row(r.key, f"{r.split} {fmt(r.step)}", r.uid, r.question, fmt(r.answer),
                      Text(fmt(r.em, 2), style=STYLE[r.outcome]), fmt(r.score, 2), fmt(r.num_searches),
                      fmt(r.response_length))
    console.print(table)


def print_compare(cmp: Comparison, limit: int | None, show: str | None, console: Console) -> None:
    """The EM line and the changed questions; with ``show`` (a list id ``qN``) both sides of that question."""
    shown = cmp.sample_changed(limit)
    if show is not None:
        ids = {f"q{i}": q for i, q in enumerate(shown)}
        if show not in ids:
            raise InspectInputError(f"--show {show}: not a question of the list (ids q0 to q{len(shown) - 1})"
                                    if shown else f"--show {show}: no question changed between A and B")
        q = ids[show]
        console.print(Text(q.text, style="bold"))
        console.print(Columns([Panel(Group(*(trajectory(r) for r in side)), title=Text(f"{name}: {src.source}"))
                               for name, src, side in (("A", cmp.a, q.a), ("B", cmp.b, q.b))], equal=True,
                              expand=True))
        return
    console.print(Text(f"A: {cmp.a.source}  vs  B: {cmp.b.source}", style="bold"))
    console.print(cmp.summary())
    console.print(sample_note(len(shown), len(cmp.changed()), limit, "questions that changed"))
    table = Table("id", "question", "EM A", "EM B", "change")
    for i, q in enumerate(shown):
        table.add_row(f"q{i}", q.text, Text(fmt(q.em_a, 2), style=STYLE[outcome(q.em_a)]),
                      Text(fmt(q.em_b, 2), style=STYLE[outcome(q.em_b)]), Text(q.change, style=STYLE[q.change]))
    console.print(table)
