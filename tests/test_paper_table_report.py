"""The paper table's report (``benchmarks/paper_table_report.py``) drawn from the rows the repository keeps.

Guards against a table that prints one seed's figure as if it were the mean over seeds, and a PNG whose bars are
flat (a fixed 0-1 y range under EMs of a few percent) or whose curve names the default validation size under
``--full``'s 200.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from benchmarks.paper_table import KEPT, ROWS
from benchmarks.paper_table_report import figure, plot, table


def kept(*names: str) -> dict[str, list[dict]]:
    figures = {name: [json.loads(p.read_text()) for p in sorted((KEPT / "vllm" / name).glob("**/row.json"))]
               for name in names}
    assert all(figures.values()), f"kept rows missing under {KEPT / 'vllm'}: {figures.keys()}"
    return figures


def test_one_seed_prints_its_interval_and_several_their_mean_and_spread():
    figures = kept("sft", "grpo_bm25")
    assert len(figures["sft"]) == 1 and len(figures["grpo_bm25"]) == 2
    lines = table(figures, {name: ROWS[name].label for name in figures}).splitlines()
    sft, grpo = lines[2], lines[3]
    em = figures["sft"][0]["answer_bearing"]
    lo, hi = em["em_ci"]
    assert f"| {ROWS['sft'].label} |" in sft and f"{em['em']:.3f} [{lo:.3f}, {hi:.3f}]" in sft
    ems = [f["answer_bearing"]["em"] for f in figures["grpo_bm25"]]
    mean, sd = sum(ems) / 2, abs(ems[0] - ems[1]) / 2 ** 0.5  # the sample sd of two values
    assert figures["grpo_bm25"][1]["resumed"] and not figures["sft"][0]["resumed"]  # seed 2 was made in four runs
    assert f"{mean:.3f} +/- {sd:.3f}" in grpo and grpo.endswith(
        f"| 2 | {sum(f['seconds'] for f in figures['grpo_bm25']) / 2 / 60:.0f} (resumed: the last run's) |")
    assert sft.endswith(f"| 1 | {figures['sft'][0]['seconds'] / 60:.0f} |")


def test_the_png_fits_its_range_to_the_figures_and_names_the_validation_size(tmp_path: Path):
    figures = kept("direct", "sft", "grpo_bm25")
    labels = {name: ROWS[name].label for name in figures}
    fig = figure(figures, labels, val_n=200)
    bars, curves = fig.axes
    # the bars show the mean over seeds with the first seed's interval; the curves every seed's points
    highest = max(*(per_seed[0][g]["em_ci"][1] for per_seed in figures.values() for g in ("all", "answer_bearing")),
                  *(em for per_seed in figures.values() for f in per_seed for em in (f.get("curve") or {}).values()))
    assert highest < 0.2  # the kept rows are a few percent: a 0-1 range would draw them flat
    assert highest < bars.get_ylim()[1] <= max(0.05, highest * 1.15) + 1e-9
    assert curves.get_ylim() == bars.get_ylim() and "first 200 questions" in curves.get_ylabel()
    assert len(curves.lines) == 2  # one validation curve per GRPO seed; the baselines have none
    plt.close(fig)
    plot(figures, labels, tmp_path / "table.png", 200)
    assert (tmp_path / "table.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("highest", [0.0, 0.5, 1.0])
def test_the_range_stays_between_a_floor_and_one(highest: float):
    row = {"seed": 1, "seconds": 60, "curve": {"4": highest},
           "all": {"em": highest, "em_ci": [highest, highest]}}
    fig = figure({"r": [row]}, {"r": "r"}, val_n=12)
    assert fig.axes[0].get_ylim()[1] == pytest.approx(min(1.05, max(0.05, highest * 1.15)))
    plt.close(fig)
