"""The viewer's page: one self-contained HTML file (docs/design.md, "Trajectory viewer").

Structure: a header (the sources and how many trajectories the page holds: a sample of how many), a bar of filters
whose options carry their counts over the page's trajectories, a list (one row per trajectory, or per question
when comparing) and, for the row clicked, its details: prompt, turns (the policy's text, then the inserted text
marked as such, with its token count), queries, answer and gold answers, reward terms, advantage and token counts.

Choices:

- Everything a reader sees is rendered here, in Python, as escaped HTML: the details of every trajectory are in the
  page (hidden until clicked), so the page and a parser see the same thing. The script (``assets.SCRIPT``) only
  filters the list and shows details; it reads the filter fields from the page's JSON.
- Nothing is fetched: the style sheet and script are inline, no font or image is used, and the page's
  Content-Security-Policy forbids any load (``default-src 'none'``) should a text ever hold markup.
- An inserted segment is a ``<span class="seg inserted" data-tokens="N">`` (no gradient: its tokens were inserted by
  the environment); a policy segment ``class="seg policy"``; a response whose file records no masks is one
  ``class="seg unmarked"`` span under a note saying so.
"""

from __future__ import annotations

import html
import json
import os
from collections import Counter
from pathlib import Path

from search_r1.inspect.assets import CSS, SCRIPT
from search_r1.inspect.compare import Comparison
from search_r1.inspect.records import (
    OUTCOMES,
    SEARCHED,
    SPLITS,
    Loaded,
    Record,
    Segment,
    describe_files,
    outcome,
    sample_note,
)

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"


def _e(value) -> str:
    """``value`` as HTML text. A carriage return is written as a character reference: a browser's parser turns a
    raw one into a line feed, which would change the text shown (a NUL would become U+FFFD: written so)."""
    return html.escape(str(value), quote=True).replace("\r", "&#13;").replace("\x00", "\ufffd")


def fmt(value: float | int | str | None, digits: int = 3) -> str:
    """A value as shown: a float with ``digits`` decimals, None as a dash."""
    if value is None:
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def turns_of(segments: list[Segment]) -> list[list[Segment]]:
    """The segments grouped into turns: a turn is a policy segment and the inserted segments after it (a response
    that starts with an inserted segment has it in its first turn)."""
    turns: list[list[Segment]] = []
    for seg in segments:
        if not turns or (seg.kind == "policy" and any(s.kind == "policy" for s in turns[-1])):
            turns.append([])
        turns[-1].append(seg)
    return turns


def _segment_html(seg: Segment) -> str:
    tokens = "" if seg.tokens is None else str(seg.tokens)
    return f'<span class="seg {_e(seg.kind)}" data-tokens="{tokens}">{_e(seg.text)}</span>'


def _turns_html(r: Record) -> str:
    if not r.segments:
        return '<p class="note">empty response</p>'
    parts = []
    if any(s.kind == "unmarked" for s in r.segments):
        parts.append('<p class="note">This file records no token masks: the inserted text (passages, feedback) is '
                     'not marked, and which tokens got a gradient is not known.</p>')
    for k, turn in enumerate(turns_of(r.segments), start=1):
        policy = sum(s.tokens or 0 for s in turn if s.kind == "policy")
        head = f"turn {k}" + (f" · {policy} policy tokens" if any(s.kind == "policy" for s in turn) else "")
        parts.append(f'<div class="turn"><div class="turn-head">{head}</div>'
                     f'<pre class="response">{"".join(_segment_html(s) for s in turn)}</pre></div>')
    return "".join(parts)


def _facts(r: Record) -> str:
    policy = sum(s.tokens or 0 for s in r.segments if s.kind == "policy") if any(
        s.kind == "policy" for s in r.segments) else None
    known = r.min_version is not None and r.min_version >= 0  # -1: the engine reported no version
    versions = f"{r.min_version} to {r.max_version}" if known else None
    facts = [("uid", r.uid), ("step", r.step), ("split", r.split), ("data source", r.data_source),
             ("dataset row", r.index), ("group", r.group), ("stop reason", r.stop_reason),
             ("searches", r.num_searches), ("turns", r.turns), ("response tokens", r.response_length),
             ("policy tokens", policy), ("tokens with no gradient", r.no_grad_tokens),
             ("policy versions", versions)]
    return '<dl class="facts">' + "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(fmt(v))}</dd></div>"
                                          for k, v in facts) + "</dl>"


def _reward_html(r: Record) -> str:
    rows = [("score", r.score), *sorted(r.reward_terms.items()), ("advantage", r.advantage)]
    return '<table class="terms">' + "".join(
        f'<tr data-term="{_e(k)}"><th>{_e(k)}</th><td>{_e(fmt(v))}</td></tr>' for k, v in rows) + "</table>"


def trajectory_html(r: Record) -> str:
    """One trajectory's details as an ``<article class="trajectory">``."""
    gold = "—" if r.ground_truth is None else " | ".join(r.ground_truth)
    queries = "<p>not recorded</p>" if r.queries is None else (
        "<p>none</p>" if not r.queries else
        '<ol class="queries">' + "".join(f"<li>{_e(q)}</li>" for q in r.queries) + "</ol>")
    verdict = r.outcome
    return (f'<article class="trajectory" data-key="{_e(r.key)}" data-uid="{_e(r.uid)}" '
            f'data-step="{_step_value(r.step)}" data-split="{_e(r.split)}">'
            f'<h3>answer</h3><p class="answer"><span class="{verdict}">{_e(verdict)}</span> · '
            f'<b class="answer-text">{_e("— (none)" if r.answer is None else r.answer)}</b> · gold: '
            f'<span class="gold">{_e(gold)}</span> · EM {_e(fmt(r.em))}</p>'
            f"{_facts(r)}<h3>prompt</h3><pre class=\"prompt\">{_e(r.input)}</pre>"
            f"<h3>turns</h3>{_turns_html(r)}<h3>queries</h3>{queries}<h3>reward</h3>{_reward_html(r)}</article>")


def _select(id_: str, label: str, options: list[tuple[str, str, int]]) -> str:
    """A filter ``<select>``: ``all`` then each (value, text, count)."""
    opts = "".join(f'<option value="{_e(v)}">{_e(text)} ({n})</option>' for v, text, n in options)
    total = sum(n for _, _, n in options)
    return f'<label>{_e(label)} <select id="{id_}"><option value="">all ({total})</option>{opts}</select></label>'


def _counted(values: list[str], order: tuple[str, ...]) -> list[tuple[str, str, int]]:
    counts = Counter(values)
    return [(v, v, counts[v]) for v in order if counts[v]]


def _step_value(step: int | None) -> str:
    return "null" if step is None else str(step)  # as the script's String(row.step)


def view_filters(records: list[Record]) -> str:
    steps = Counter(_step_value(r.step) for r in records)
    step_opts = [(v, v if v != "null" else "none", n) for v, n in
                 sorted(steps.items(), key=lambda kv: (kv[0] == "null", int(kv[0]) if kv[0] != "null" else 0))]
    parts = [_select("f-step", "step", step_opts)]
    splits = _counted([r.split for r in records], SPLITS)
    if len(splits) > 1:
        parts.append(_select("f-split", "split", splits))
    parts.append(_select("f-outcome", "outcome", _counted([r.outcome for r in records], OUTCOMES)))
    parts.append(_select("f-search", "searched", _counted([r.searched_label for r in records], SEARCHED)))
    terms = (["score"] if any(r.score is not None for r in records) else []) + sorted(
        {k for r in records for k in r.reward_terms})
    term_opts = "".join(f'<option value="{_e(t)}">{_e(t)}</option>' for t in terms)
    parts.append(f'<label>reward term <select id="f-term"><option value="">—</option>{term_opts}</select></label>'
                 '<label>from <input id="f-term-min" type="number" step="any"></label>'
                 '<label>to <input id="f-term-max" type="number" step="any"></label>')
    parts.append('<label>response tokens from <input id="f-len-min" type="number" step="1"></label>'
                 '<label>to <input id="f-len-max" type="number" step="1"></label>')
    return "".join(parts)


def _list_row(id_: str, cells: list[tuple[str, str]]) -> str:
    return f'<tr class="row" data-id="{_e(id_)}">' + "".join(
        f'<td class="{cls}">{_e(text)}</td>' for cls, text in cells) + "</tr>"


def _clip(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def view_page(loaded: Loaded, limit: int | None) -> str:
    """The page of one source's trajectories (a sample of at most ``limit``)."""
    records = loaded.records
    rows = [{"id": r.key, "step": r.step, "split": r.split, "em": r.em, "searched": r.searched,
             "length": r.response_length, "score": r.score, "terms": r.reward_terms} for r in records]
    head = ["step", "uid", "question", "answer", "EM", "score", "searches", "tokens"]
    body = "".join(_list_row(r.key, [
        ("step", f"{r.split} {fmt(r.step)}"), ("uid", r.uid), ("question", _clip(r.question)),
        ("answer", _clip(r.answer or "—", 40)), (r.outcome, fmt(r.em, 2)), ("score", fmt(r.score, 2)),
        ("searches", fmt(r.num_searches)), ("tokens", fmt(r.response_length))]) for r in records)
    details = "".join(f'<section class="detail" id="d-{_e(r.key)}" hidden>{trajectory_html(r)}</section>'
                      for r in records)
    header = (f"<h1>Trajectories of {_e(loaded.source)}</h1>"
              f'<p id="sample-note">{_e(sample_note(len(records), loaded.total, limit, "trajectories"))}</p>'
              f"<p>Files: {_e(describe_files(loaded.files))}.</p>")
    return _document(f"Trajectories: {loaded.source}", header, view_filters(records), head, body, details,
                     {"mode": "view", "rows": rows}, len(records))


def _side_html(name: str, side: Loaded, records: list[Record]) -> str:
    return (f'<div class="side side-{name.lower()}"><h2>{_e(name)}: {_e(side.source)}</h2>'
            + "".join(trajectory_html(r) for r in records) + "</div>")


def compare_page(cmp: Comparison, limit: int | None) -> str:
    """The page of a comparison: the questions one side got right and the other wrong (a sample of at most
    ``limit``), both sides' trajectories side by side, the EM difference and its paired interval."""
    shown = cmp.sample_changed(limit)
    ids = {id(q): f"q{i}" for i, q in enumerate(shown)}
    rows = [{"id": ids[id(q)], "change": q.change} for q in shown]
    head = ["question", "EM A", "EM B", "change"]
    body = "".join(_list_row(ids[id(q)], [("question", _clip(q.text)), (outcome(q.em_a), fmt(q.em_a, 2)),
                                          (outcome(q.em_b), fmt(q.em_b, 2)), (q.change, q.change)]) for q in shown)
    details = "".join(f'<section class="detail pair" id="d-{ids[id(q)]}" hidden>{_side_html("A", cmp.a, q.a)}'
                      f'{_side_html("B", cmp.b, q.b)}</section>' for q in shown)
    filters = _select("f-change", "change", _counted([q.change for q in shown], ("fixed", "broken")))
    header = (f"<h1>A: {_e(cmp.a.source)} &nbsp;vs&nbsp; B: {_e(cmp.b.source)}</h1>"
              f'<p id="em-summary">{_e(cmp.summary())}</p>'
              f'<p id="sample-note">{_e(sample_note(len(shown), len(cmp.changed()), limit, "questions that changed"))}'
              "</p>")
    return _document(f"Compare: {cmp.a.source} vs {cmp.b.source}", header, filters, head, body, details,
                     {"mode": "compare", "rows": rows}, len(shown))


def _json_for_script(data: dict) -> str:
    """JSON that cannot end its ``<script>`` element (every <, > and & escaped)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _document(title: str, header: str, filters: str, head: list[str], body: str, details: str, data: dict,
              shown: int) -> str:
    columns = "".join(f"<th>{_e(h)}</th>" for h in head)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f'<header>{header}</header><div id="filters">{filters}'
        f'<span><b id="shown">{shown}</b> shown</span></div>'
        f'<main class="{data["mode"]}"><div id="list-pane">'
        f'<table id="list"><thead><tr>{columns}</tr></thead><tbody>{body}</tbody></table></div>'
        f'<div id="detail-pane"><p id="empty">Click a row to see it.</p>{details}</div></main>'
        f'<script type="application/json" id="trajectory-data">{_json_for_script(data)}</script>'
        f"<script>{SCRIPT}</script></body></html>\n")


def write_page(text: str, out: Path) -> Path:
    """Write ``text`` to ``out`` atomically (a crash leaves the previous file or none, never half a page)."""
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out

