"""benchmarks/group_signal.py: what a GRPO group's samples differ in, read from a training run's rollouts and from a
sampled evaluation."""

import json

import pytest

from benchmarks import group_signal

HIT = "<information>Doc 1(Title: Kelmor) Kelmor's harbour master is Ulla Brenn.</information>"
MISS = "<information>Doc 1(Title: Drunon) The Drunon was built in 1714.</information>"
QUESTION = "who was the harbour master of kelmor"


def rollout(step: int, group: str, query: str, block: str, score: float, split: str = "train") -> dict:
    prompt = f"<|im_start|>user\nAnswer it. Question: {QUESTION}?\n<|im_end|>\n<|im_start|>assistant\n"
    return {"step": step, "split": split, "group": group, "input": prompt, "queries": [query],
            "output": f"<search> {query} </search>\n\n{block}\n\n<answer> x </answer>", "ground_truth": ["Ulla Brenn"],
            "score": score}


def test_groups_are_counted_by_what_their_samples_differ_in(tmp_path):
    """Guards against a figure that cannot tell a flat group from a varied one: the same question in another step
    counted as one group with it, validation records read as training samples, the question's own query not
    recognised under another case or its question mark, or retrieval judged by the query rather than the passages."""
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    steps = {1: [rollout(1, "row7", QUESTION + "?", HIT, 1.0), rollout(1, "row7", QUESTION.upper(), HIT, 1.0),
                 rollout(1, "row7", "x", MISS, 0.0, split="val"), rollout(1, "row7", "y", MISS, 0.0, split="val")],
             2: [rollout(2, "row7", QUESTION, HIT, 1.0), rollout(2, "row7", "drunon 1714", MISS, 0.0)]}
    for step, rows in steps.items():
        (rollouts / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = group_signal.signal(group_signal.records(rollouts))
    assert figures == {"groups": 2, "samples": 4, "queries": 4, "question": 3, "queries_differ": 1,
                       "retrieval_differs": 1, "em_differs": 1}

    evaluation = tmp_path / "eval"  # search_r1.evaluate --n 2: the same records under the evaluation's names
    evaluation.mkdir()
    rows = [{**{k: v for k, v in r.items() if k not in ("input", "output", "ground_truth")}, "prompt": r["input"],
             "response": r["output"], "golden": r["ground_truth"], "group": "row0"} for r in steps[2]]
    (evaluation / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert group_signal.signal(group_signal.records(evaluation)) == {
        "groups": 1, "samples": 2, "queries": 2, "question": 1, "queries_differ": 1, "retrieval_differs": 1,
        "em_differs": 1}


def test_a_folder_without_records_is_named(tmp_path):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        group_signal.main([str(tmp_path)])


def test_a_question_and_phrase_mix_differs_where_the_question_and_its_phrases_disagree():
    """Guards ``benchmarks/rephrase_ceiling.py``'s mix column against counting a group as differing when every query
    finds the same (all hit or all miss), and against a phrase-less question being treated as a miss."""
    from benchmarks.rephrase_ceiling import mixed

    assert mixed([True, False, True], [[True, True], [False], []], 0.5, 4) == (2.0, 0.0)
    assert mixed([True, False], [[False, False], [True]], 0.0, 4) == (1.0, 0.0)
    found, differ = mixed([True, False], [[False, False], [True, False]], 0.5, 4)
    # the first samples a hit with p = 0.5 (1 - 2/16 of its groups differ), the second with p = 0.25
    assert found == pytest.approx(0.75)
    assert differ == pytest.approx((1 - 2 / 16) + (1 - 0.25 ** 4 - 0.75 ** 4))
