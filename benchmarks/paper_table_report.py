"""The paper table's report: the markdown table and the PNG, from each row's figures (``row.json`` per seed).

``figures`` maps a row's name to its seeds' figures, in table order; ``labels`` maps it to the label printed. Kept
apart from ``benchmarks/paper_table.py`` (which makes the rows) so either changes without the other.
"""

from __future__ import annotations

import statistics
from pathlib import Path


def _cell(per_seed: list[dict], group: str, key: str, digits: int = 3) -> str:
    """One figure of a row: ``value [lo, hi]`` for one seed; ``mean +/- sd (n seeds)`` over several."""
    values = [f[group][key] for f in per_seed if f.get(group)]
    if not values:
        return "-"
    if len(values) == 1:
        lo, hi = per_seed[0][group][f"{key}_ci"]
        return f"{values[0]:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{statistics.mean(values):.{digits}f} +/- {statistics.stdev(values):.{digits}f}"


COLUMNS = (("all", "em", "EM, all"), ("answer_bearing", "em", "EM, answer-bearing"),
           ("answer_bearing", "recall", "retrieval recall (a.-b.)"), ("all", "searches", "searches"),
           ("all", "turns", "turns"), ("all", "response_tokens", "response tokens"),
           ("answer_bearing", "wrong_retrieved", "wrong, gold retrieved (a.-b.)"),
           ("answer_bearing", "name_read", "of which another name read"),
           ("answer_bearing", "wrong_not_retrieved", "wrong, not retrieved (a.-b.)"))


def table(figures: dict[str, list[dict]], labels: dict[str, str]) -> str:
    """Markdown: one line per row, each figure with its 95% interval (one seed) or mean +/- sd over seeds."""
    head = ["row", *(label for _, _, label in COLUMNS), "seeds", "minutes per seed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, per_seed in figures.items():
        digits = {"searches": 2, "turns": 2, "response_tokens": 1}
        cells = [_cell(per_seed, group, key, digits.get(key, 3)) for group, key, _ in COLUMNS]
        minutes = f"{statistics.mean(f['seconds'] for f in per_seed) / 60:.0f}"
        if any(f.get("resumed") for f in per_seed):  # the seconds are those of the run that finished it
            minutes += " (resumed: the last run's)"
        lines.append(f"| {labels[name]} | " + " | ".join(cells) + f" | {len(per_seed)} | {minutes} |")
    return "\n".join(lines)


def figure(figures: dict[str, list[dict]], labels: dict[str, str], val_n: int):
    """EM per row with its 95% interval (all / answer-bearing; the first seed's interval, the mean over seeds), and
    the RL rows' validation EM against training step (one line per row and seed). Both panels share a y range that
    fits the highest interval or point (EM on Wikipedia is a few percent: a fixed 0-1 range drew every bar flat)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    names = list(figures)
    highest = 0.0
    for offset, group, label in ((-0.2, "all", "all test questions"), (0.2, "answer_bearing", "answer-bearing")):
        present = [(i, figures[n]) for i, n in enumerate(names) if figures[n][0].get(group)]
        means = [statistics.mean(f[group]["em"] for f in per_seed) for _, per_seed in present]
        cis = [per_seed[0][group]["em_ci"] for _, per_seed in present]
        errors = [[max(m - lo, 0) for m, (lo, _) in zip(means, cis, strict=True)],
                  [max(hi - m, 0) for m, (_, hi) in zip(means, cis, strict=True)]]
        bars.bar([i + offset for i, _ in present], means, 0.4, yerr=errors, capsize=3, label=label)
        highest = max([highest, *means, *(hi for _, hi in cis)])
    bars.set_xticks(range(len(names)), [labels[n] for n in names], rotation=30, ha="right", fontsize=7)
    bars.set_ylabel("test EM (95% bootstrap CI)")
    bars.legend(fontsize=8)
    for name in names:
        for f in figures[name]:
            points = sorted((int(step), em) for step, em in (f.get("curve") or {}).items())
            if points:
                curves.plot(*zip(*points), marker="o", label=f"{name} seed {f['seed']}")
                highest = max([highest, *(em for _, em in points)])
    top = min(1.05, max(0.05, highest * 1.15))
    bars.set_ylim(0, top)
    curves.set_ylim(0, top)
    curves.set_xlabel("training step")
    curves.set_ylabel(f"validation EM (first {val_n} questions)")
    if curves.lines:
        curves.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot(figures: dict[str, list[dict]], labels: dict[str, str], path: Path, val_n: int) -> None:
    """``figure`` written to ``path`` as a PNG."""
    fig = figure(figures, labels, val_n)  # selects the Agg backend before pyplot is imported here
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
