"""`make demo`'s verdict: inside the ranges exit 0, outside exit 1 naming the figure and the environment, a run
without validation exit 2.

Guards against a demo that ends at +0.035 EM with no second hop and exits 0 as if that were what it shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from data_prep import demo_check

RANGES = {"val/em": [0.45, 0.8], "val/em/demo_multi": [0.3, 0.7], "val/searches/demo_multi": [1.6, 2.1]}


def run_dir(tmp_path: Path, after: dict[str, float]) -> Path:
    before = {"val/em": 0.2, "val/em/demo_multi": 0.0, "val/searches/demo_multi": 0.6}
    records = [{"step": 0, **before}, {"step": 5, "train/loss": 1.0}, {"step": 62, **after}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def ranges_file(tmp_path: Path) -> Path:
    path = tmp_path / "expected.yaml"
    path.write_text(yaml.safe_dump(RANGES))
    return path


def test_inside_the_ranges_is_ok(tmp_path, capsys):
    d = run_dir(tmp_path, {"val/em": 0.6, "val/em/demo_multi": 0.45, "val/searches/demo_multi": 1.9})
    assert demo_check.main([str(d), "--expected", str(ranges_file(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "0.200 -> 0.600" in out and "OK" in out


def test_no_second_hop_fails_naming_the_figure_and_the_packages(tmp_path, capsys):
    # The figures of the broken demo of 2026-11-24: +0.035 EM, two-hop 0.000, one search on two-hop questions.
    d = run_dir(tmp_path, {"val/em": 0.375, "val/em/demo_multi": 0.0, "val/searches/demo_multi": 1.0})
    assert demo_check.main([str(d), "--expected", str(ranges_file(tmp_path))]) == 1
    captured = capsys.readouterr()
    assert "two-hop EM" in captured.err and "searches per two-hop question" in captured.err
    assert "torch " in captured.err and "numerics:" in captured.err


def test_a_run_without_validation_is_exit_2(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 1.0}) + "\n")
    assert demo_check.main([str(tmp_path), "--expected", str(ranges_file(tmp_path))]) == 2
    assert demo_check.main([str(tmp_path / "missing"), "--expected", str(ranges_file(tmp_path))]) == 2
