"""``search-r1-inspect A B``: two real evaluations (``search_r1.evaluate``'s ``trajectories.jsonl`` as written today)
and a run's training step compared on their questions; the paired bootstrap checked against a plain loop."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from search_r1.inspect import compare_paths
from tests.search_r1.inspect.viewer import inspect, no_display_env, option_counts, page_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]  # engines, a service


def em_by_row(evaluation: Path) -> dict[int, float]:
    return {r["row"]: r["em"] for r in map(json.loads, (evaluation / "trajectories.jsonl").read_text().splitlines())}


def plain_paired_bootstrap(a: list[float], b: list[float], resamples: int = 1000) -> list[float]:
    """The 95% percentile interval of mean(b - a) over questions resampled with replacement, one draw at a time
    (numpy's generator with the report's seed, as ``eval_report.bootstrap_ci`` draws), percentiles interpolated
    linearly between order statistics."""
    import numpy as np

    rng = np.random.default_rng(0)
    means = []
    for _ in range(resamples):
        total = 0.0
        for _ in range(len(a)):
            q = int(rng.integers(0, len(a)))
            total += b[q] - a[q]
        means.append(total / len(a))
    means.sort()

    def percentile(p: float) -> float:
        pos = p / 100 * (len(means) - 1)
        lo = math.floor(pos)
        return means[lo] + (means[min(lo + 1, len(means) - 1)] - means[lo]) * (pos - lo)

    return [percentile(2.5), percentile(97.5)]


def test_questions_one_got_right_and_the_other_wrong_side_by_side_with_the_paired_interval(evaluations, tmp_path):
    """Guards against a comparison that lists the wrong questions (unchanged ones, or fixed ones as broken), pairs a
    question with another question's trajectory, or reports a difference or interval that is not the paired
    bootstrap over questions: A (rows 0 and 1 right) against B (all wrong) lists exactly rows 0 and 1 as broken,
    each with A's and B's trajectory of that row, and the EM line holds the plain loop's difference and interval;
    B against A lists them as fixed."""
    a, b = evaluations
    em_a, em_b = em_by_row(a), em_by_row(b)
    assert sorted(em_a) == sorted(em_b) and sum(em_a.values()) == 2 and sum(em_b.values()) == 0
    rows = sorted(em_a)
    for first, second, change in ((a, b, "broken"), (b, a, "fixed")):
        dom = page_of(tmp_path, str(first), str(second))
        expected = [r for r in rows if em_a[r] != em_b[r]]
        assert option_counts(dom, "f-change") == {"": len(expected), change: len(expected)}
        pairs = dom.by_class("pair")
        assert len(pairs) == len(dom.by_class("row")) == len(expected)
        for pair, row in zip(pairs, expected, strict=True):  # in A's order
            (side_a,) = pair.by_class("side-a")
            (side_b,) = pair.by_class("side-b")
            assert [t.attrs["data-uid"] for t in side_a.by_class("trajectory")] == [f"row{row}-0"]
            assert [t.attrs["data-uid"] for t in side_b.by_class("trajectory")] == [f"row{row}-0"]
        first_em, second_em = (em_a, em_b) if first == a else (em_b, em_a)
        diff = sum(second_em[r] - first_em[r] for r in rows) / len(rows)
        low, high = plain_paired_bootstrap([first_em[r] for r in rows], [second_em[r] for r in rows])
        assert (f"B - A = {diff:+.3f}, paired bootstrap 95% interval [{low:+.3f}, {high:+.3f}]"
                in dom.by_id("em-summary").text)
    cmp = compare_paths(b, a)  # (the last pair of the loop)
    assert cmp.diff == pytest.approx(diff) and cmp.ci == pytest.approx([low, high])


def test_an_evaluation_and_a_training_step_are_matched_by_dataset_row(evaluations, recorded, tmp_path):
    """Guards against matching only files of one format, or matching by position: today's evaluation record (row)
    and the trajectory record (index, two samples per question, their EM averaged) meet on the dataset row; the
    question only the evaluation has is counted apart, not compared."""
    a, b = evaluations
    run_dir, steps, _ = recorded
    step2 = run_dir / "rollouts" / "2.jsonl"
    cmp = compare_paths(b, step2)
    assert cmp.matched_by == "dataset row" and cmp.only_a == 1 and cmp.only_b == 0
    step_em = {}
    for r in steps[1].records:
        step_em.setdefault(r["index"], []).append(r["reward_terms"]["em"])
    assert {q.key[1]: q.em_b for q in cmp.questions} == {k: sum(v) / len(v) for k, v in step_em.items()}
    assert sorted(q.key[1] for q in cmp.changed("fixed")) == [0, 1] and not cmp.changed("broken")
    assert all(len(q.b) == 2 for q in cmp.questions)


def test_compare_refuses_sides_it_cannot_pair_and_writes_nothing(evaluations, recorded, tmp_path):
    """Guards against a comparison that silently pools several steps of a run into one side, or compares rows whose
    files record no gold answers as if they were wrong: both are exit 2 naming the path and what to do, and no page
    is written."""
    a, _ = evaluations
    run_dir, _, _ = recorded
    out = tmp_path / "compare.html"
    done = inspect(str(a), str(run_dir), "--out", str(out))
    assert done.returncode == 2 and not out.exists()
    assert "holds trajectories of 3 steps (train step 1, train step 2, val step 2)" in done.stderr
    assert "--step N" in done.stderr and "Traceback" not in done.stderr
    assert inspect(str(a), str(run_dir / "validation" / "2.jsonl"), "--out", str(out)).returncode == 0  # one step
    out.unlink()
    done = inspect(str(a), str(run_dir / "rollout_data_dir" / "2.jsonl"), "--out", str(out))
    assert done.returncode == 2 and not out.exists()
    assert "no exact match to compare" in done.stderr and "uid row0" in done.stderr


def test_compare_in_the_terminal(evaluations):
    """Guards against --text comparing differently from the page or needing a display: it prints the same EM line,
    the changed questions and, with --show, both sides' answers of one of them."""
    a, b = evaluations
    done = inspect(str(a), str(b), "--text", env=no_display_env())
    assert done.returncode == 0, done.stderr
    assert compare_paths(a, b).summary() in done.stdout
    assert "What is the capital of France?" in done.stdout and "broken" in done.stdout
    done = inspect(str(a), str(b), "--text", "--show", "q0", env=no_display_env())
    assert done.returncode == 0, done.stderr
    assert "A: " in done.stdout and "B: " in done.stdout and "answer: 'Paris'" in done.stdout
    assert "answer: None" in done.stdout and "stop reason" in done.stdout


def test_an_evaluation_is_viewed_with_its_scores(evaluations, tmp_path):
    """Guards against the viewer misreading the evaluation's records: each row's EM is the file's em, its tokens
    with no gradient the file's inserted_tokens, and its response the file's segments in order (inserted spans
    marked)."""
    a, _ = evaluations
    dom = page_of(tmp_path, str(a))
    lines = [json.loads(line) for line in (a / "trajectories.jsonl").read_text().splitlines()]
    rows = {r["id"]: r for r in json.loads(dom.by_id("trajectory-data").text)["rows"]}
    for article in dom.by_class("trajectory"):
        line = next(x for x in lines if x["uid"] == article.attrs["data-uid"])
        assert rows[article.attrs["data-key"]]["em"] == line["em"]
        facts = dict(zip((e.text for e in article.find_all(lambda e: e.tag == "dt")),
                         (e.text for e in article.find_all(lambda e: e.tag == "dd")), strict=True))
        assert facts["tokens with no gradient"] == str(line["inserted_tokens"])
        assert [s.attrs["class"].split()[-1] for s in article.by_class("seg")] == \
            [seg["kind"] for seg in line["segments"]]
    assert len(dom.by_class("trajectory")) == len(lines)
