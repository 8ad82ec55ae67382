"""benchmarks/paired_rows.py: two rows of the paper's table compared question by question."""

import json

import pytest

from benchmarks import paired_rows


def write_eval(folder, ems, bearing=None, golden=None):
    """An evaluation directory of one greedy sample per question: ``ems[i]`` is question i's EM."""
    folder.mkdir(parents=True)
    bearing = bearing or [True] * len(ems)
    lines = [json.dumps({"row": i, "sample": 0, "em": em, "answer_bearing": bearing[i],
                         "golden": (golden or {}).get(i, [f"gold {i}"])}) for i, em in enumerate(ems)]
    (folder / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_discordant_questions_are_counted_each_way_and_split_by_answer_bearing(tmp_path, capsys):
    """Guards against counting questions both rows get right (or wrong) as a difference, against swapping which row
    gained, and against the answer-bearing figures being the whole test's."""
    a = write_eval(tmp_path / "out" / "grpo" / "seed1" / "eval", [1, 1, 0, 0, 1, 0, 0, 0],
                   bearing=[True, True, True, True, False, False, True, True])
    write_eval(tmp_path / "out" / "nomask" / "seed1" / "eval", [1, 0, 1, 1, 0, 1, 0, 0],
               bearing=[True, True, True, True, False, False, True, True])
    both = paired_rows.scores(a / "trajectories.jsonl")
    other = paired_rows.scores(tmp_path / "out" / "nomask" / "seed1" / "eval" / "trajectories.jsonl")
    f = paired_rows.pair(both, other)
    assert (f["n"], f["only_a"], f["only_b"]) == (8, 2, 3)
    assert f["diff"] == pytest.approx(1 / 8)
    lo, hi = f["diff_ci"]
    assert lo <= f["diff"] <= hi
    g = paired_rows.pair(both, other, bearing_only=True)
    assert (g["n"], g["only_a"], g["only_b"]) == (6, 1, 2)

    assert paired_rows.main(["grpo/seed1", "nomask/seed1", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "| nomask/seed1 | all: 8 | 0.375 / 0.500 | 2 | 3 |" in printed
    assert "| nomask/seed1 | answer-bearing: 6 | 0.333 / 0.500 | 1 | 2 |" in printed


def test_the_sign_test_is_the_exact_two_sided_binomial():
    """Guards against a one-sided p or a normal approximation: 0 against 5 is 2 / 32; an even split is 1."""
    assert paired_rows.sign_test(0, 5) == pytest.approx(2 / 32)
    assert paired_rows.sign_test(5, 0) == pytest.approx(2 / 32)
    assert paired_rows.sign_test(3, 3) == 1.0
    assert paired_rows.sign_test(0, 0) == 1.0
    stats = pytest.importorskip("scipy.stats")
    for only_a, only_b in ((7, 24), (4, 11), (10, 19), (6, 14)):
        assert paired_rows.sign_test(only_a, only_b) == pytest.approx(
            stats.binomtest(only_b, only_a + only_b, 0.5).pvalue)


def test_rows_of_another_test_set_or_sampled_evaluations_are_refused(tmp_path):
    """Guards against pairing rows that did not answer the same questions, or a sampled evaluation's several
    samples per question read as one."""
    a = paired_rows.scores(write_eval(tmp_path / "a", [1, 0, 0]) / "trajectories.jsonl")
    shorter = paired_rows.scores(write_eval(tmp_path / "b", [1, 0]) / "trajectories.jsonl")
    with pytest.raises(SystemExit, match="different questions"):
        paired_rows.pair(a, shorter)
    other_golds = paired_rows.scores(write_eval(tmp_path / "c", [1, 0, 0], golden={1: ["else"]}) / "trajectories.jsonl")
    with pytest.raises(SystemExit, match="question 1 has different gold answers or answer-bearing flags"):
        paired_rows.pair(a, other_golds)
    sampled = tmp_path / "d"
    sampled.mkdir()
    sampled.joinpath("trajectories.jsonl").write_text(
        "".join(json.dumps({"row": 0, "sample": s, "em": 1, "golden": ["g"]}) + "\n" for s in (0, 1)))
    with pytest.raises(SystemExit, match="more than one sample"):
        paired_rows.scores(sampled / "trajectories.jsonl")


def test_a_row_without_an_evaluation_is_named_with_the_paths_looked_at(tmp_path):
    write_eval(tmp_path / "out" / "sft" / "eval", [1])
    (tmp_path / "kept" / "rag").mkdir(parents=True)
    (tmp_path / "kept" / "rag" / "row.json").write_text(json.dumps({"row": "rag"}))  # kept without per_question
    with pytest.raises(SystemExit, match=r"rag: no evaluation found; looked for .*rag/eval/trajectories.jsonl, "
                                         r".*out/rag/row.json, .*kept/rag/row.json"):
        paired_rows.main(["sft", "rag", "--out", str(tmp_path / "out"), "--kept", str(tmp_path / "kept")])


def test_a_kept_row_json_pairs_as_its_trajectories_do(tmp_path, capsys):
    """Guards against per_question losing or shifting a question (the kept rows are all a fresh machine has of hours
    of training), against rows of another test set pairing through it, and against --out's evaluation not being
    preferred to the kept copy."""
    bearing = [True, False, True, True, False, True, True]
    ems = [1, 0, 0, 1, 1, 0, 0]
    a = write_eval(tmp_path / "out" / "grpo" / "seed1" / "eval", ems, bearing=bearing)
    b = write_eval(tmp_path / "b", [0, 1, 0, 1, 0, 0, 1], bearing=bearing)
    gapped = tmp_path / "gapped"  # questions 0-2 and 5-6 (an evaluation of some rows only)
    gapped.mkdir()
    gapped.joinpath("trajectories.jsonl").write_text("".join(
        json.dumps({"row": q, "em": q % 2, "answer_bearing": q < 3, "golden": [f"gold {q}"]}) + "\n"
        for q in (0, 1, 2, 5, 6)))
    record = paired_rows.per_question(gapped / "trajectories.jsonl")
    assert record["rows"] == [[0, 3], [5, 7]] and record["em"] == "01010" and record["answer_bearing"] == "11100"

    kept = tmp_path / "kept" / "grpo" / "seed1" / "row.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"row": "grpo", "per_question": paired_rows.per_question(a / "trajectories.jsonl")}))
    from_json, from_traj = paired_rows.scores(kept), paired_rows.scores(a / "trajectories.jsonl")
    assert from_json.test_sha256 == from_traj.test_sha256
    assert {q: (v["em"], v["bearing"]) for q, v in from_json.by_row.items()} == \
        {q: (v["em"], v["bearing"]) for q, v in from_traj.by_row.items()}
    other = paired_rows.scores(b / "trajectories.jsonl")
    for bearing_only in (False, True):
        assert paired_rows.pair(from_json, other, bearing_only) == paired_rows.pair(from_traj, other, bearing_only)

    # the row pairs from the kept copy once --out lacks it, and from --out's evaluation while it has it
    argv = ["grpo/seed1", str(b), "--kept", str(tmp_path / "kept")]
    assert paired_rows.main([*argv, "--out", str(tmp_path / "elsewhere")]) == 0
    printed = capsys.readouterr().out
    assert f"grpo/seed1: {kept}" in printed and f"| {b} | all: 7 | 0.429 / 0.429 | 2 | 2 |" in printed
    assert paired_rows.main([*argv, "--out", str(tmp_path / "out")]) == 0
    assert f"grpo/seed1: {a / 'trajectories.jsonl'}" in capsys.readouterr().out

    # another test set: the same rows, one gold changed; only the fingerprint can tell, and it does
    c = paired_rows.scores(write_eval(tmp_path / "c", ems, bearing=bearing, golden={4: ["else"]}) /
                           "trajectories.jsonl")
    with pytest.raises(SystemExit, match="test_sha256 differ: other gold answers or answer-bearing flags"):
        paired_rows.pair(from_json, c)
    damaged = json.loads(kept.read_text())
    damaged["per_question"]["em"] = damaged["per_question"]["em"][:-1]
    kept.write_text(json.dumps(damaged))
    with pytest.raises(SystemExit, match="holds 7 rows, 6 EMs and 7 flags"):
        paired_rows.scores(kept)
