"""``search-r1-inspect``'s refusals: every bad path, option or line is exit 2 with one message naming it and what is
allowed, and nothing is written; a torn last line (a writer killed mid-line) is skipped with a warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from search_r1.inspect.cli import main


def record(uid: str, step: int = 1, em: float = 1.0) -> dict:
    """A line of the trajectory record (only what these tests read)."""
    return {"step": step, "split": "train", "uid": uid, "group": uid, "index": 0, "data_source": "toy",
            "input": "Question: q?", "output": "<answer> a </answer>",
            "segments": [{"kind": "policy", "text": "<answer> a </answer>", "tokens": 5}], "queries": [],
            "answer": "a", "ground_truth": ["a"], "score": em, "reward_terms": {"em": em}, "advantage": 0.0,
            "stop_reason": "answered", "num_searches": 0, "turns": 1, "response_length": 5}


@pytest.fixture
def rollouts(tmp_path) -> Path:
    """A run directory with rollouts/1.jsonl (2 lines) and rollouts/2.jsonl (1 line)."""
    directory = tmp_path / "run" / "rollouts"
    directory.mkdir(parents=True)
    (directory / "1.jsonl").write_text("".join(json.dumps(record(f"u{i}")) + "\n" for i in range(2)))
    (directory / "2.jsonl").write_text(json.dumps(record("v0", step=2)) + "\n")
    return tmp_path / "run"


def refused(capsys, *argv: str) -> str:
    """Run the command; it must exit 2 with one ``error:`` line (or argparse's usage error); returns stderr."""
    try:
        status = main(list(argv))
    except SystemExit as stop:  # argparse
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err and ("error:" in err)
    return err


def test_bad_paths_and_options_are_refused_and_nothing_is_written(rollouts, tmp_path, capsys):
    """Guards against a traceback or a half-written page for a mistyped path, a directory with no trajectories, a
    step the run does not have, an --out that cannot be written, or options that make no sense together."""
    out = tmp_path / "page.html"
    assert "no such file or directory" in refused(capsys, str(tmp_path / "nope"), "--out", str(out))
    (tmp_path / "empty").mkdir()
    err = refused(capsys, str(tmp_path / "empty"), "--out", str(out))
    assert "no trajectories found" in err and "trajectories.jsonl" in err and "rollout_data_dir" in err
    err = refused(capsys, str(rollouts), "--step", "7", "--out", str(out))
    assert "no trajectory file for step 7; it has train steps 1, 2" in err
    err = refused(capsys, str(rollouts), "--out", str(tmp_path / "missing" / "page.html"))
    assert "does not exist" in err
    assert "is a directory" in refused(capsys, str(rollouts), "--out", str(tmp_path))
    assert "--limit must be >= 1" in refused(capsys, str(rollouts), "--limit", "0")
    assert "--show" in refused(capsys, str(rollouts), "--show", "u0")
    assert "one path to view or two" in refused(capsys, str(rollouts), str(rollouts), str(rollouts))
    assert "--show u9" in refused(capsys, str(rollouts), "--text", "--show", "u9")
    (rollouts / "notes.txt").write_text("x")
    assert "not a .jsonl file" in refused(capsys, str(rollouts / "notes.txt"), "--out", str(out))
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


def test_a_damaged_line_is_named_and_a_torn_last_line_skipped(rollouts, tmp_path, capsys, caplog):
    """Guards against a viewer that dies on (or silently drops) a damaged file: a line in the middle that is not
    JSON, or not a record (a segment without its text), is exit 2 naming the file and line; a last line cut off
    without its newline (the writer was killed) is skipped with a warning and the rest is shown."""
    path = rollouts / "rollouts" / "1.jsonl"
    good = path.read_text()
    path.write_text(good.replace("\n", "\n{not json\n", 1))
    out = tmp_path / "page.html"
    assert f"{path}:2: not valid JSON" in refused(capsys, str(rollouts), "--out", str(out))
    assert not out.exists()
    path.write_text(good + json.dumps(record("torn"))[:40])
    assert main([str(rollouts), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and "skipping a torn last line" in caplog.text
    page = out.read_text()
    assert 'data-uid="u1"' in page and 'data-uid="torn"' not in page
    path.write_text(good + "[1, 2]\n")
    assert f"{path}:3: a JSON list, not an object" in refused(capsys, str(rollouts), "--out", str(out))
    path.write_text(good + json.dumps({**record("bad"), "segments": [{"kind": "policy"}]}) + "\n")
    assert f"{path}:3: not a trajectory record (KeyError: 'text')" in refused(capsys, str(rollouts), "--out", str(out))
    assert not out.with_name(out.name + ".tmp").exists()
