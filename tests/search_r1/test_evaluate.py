"""The evaluation command end to end: a tiny memorising policy, the real retrieval service on loopback, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from search_r1.evaluate import main
from tests.search_r1.memorised_policy import QUESTIONS, TOPK
from tests.trajectory_records import check_record

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

FRANCE, TOKYO = QUESTIONS  # the policy answers Paris / Japan after one search
# (data_source, question, golden answers): per source one right and one wrong answer under the default scoring;
# the curly-quoted golden answer is right only under reward.normalize=unicode.
ROWS = [("src_a", FRANCE, ["Paris"]), ("src_a", TOKYO, ["“Japan”"]),
        ("src_b", TOKYO, ["Japan", "Nippon"]), ("src_b", FRANCE, ["Lyon"])]
SOURCE_KEYS = {"n", "em", "em_ci", "subem", "f1", "f1_ci", "stop_reasons",
               *(f"{name}{ci}" for name in ("searches", "turns", "response_tokens", "recall", "wrong_retrieved",
                                            "name_read", "wrong_not_retrieved") for ci in ("", "_ci"))}


@pytest.fixture(scope="module")
def test_parquet(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "test.parquet"
    rows_to_parquet([make_row(source, question, golden, "test", i) for i, (source, question, golden)
                     in enumerate(ROWS)], path)
    return path


def _argv(policy, data: Path, url: str, out: Path, *extra: str) -> list[str]:
    model_dir = policy[0]
    return ["--model", str(model_dir), "--data", str(data), "--retriever-url", url, "--out", str(out),
            "--batch-size", "2", *extra, f"retriever.topk={TOPK}"]


@pytest.fixture(scope="module")
def one_shot(policy, test_parquet, service_url, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A complete greedy evaluation through the real CLI entry point -> (out dir, finished process)."""
    out = tmp_path_factory.mktemp("one_shot")
    done = subprocess.run([sys.executable, "-m", "search_r1.evaluate", *_argv(policy, test_parquet, service_url, out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out, done


def _lines(out: Path) -> list[str]:
    return (out / "trajectories.jsonl").read_text().splitlines()


def test_evaluate_writes_the_results_of_the_training_loop(one_shot, policy):
    """Guards against the evaluation running another loop or prompt than training (the memorised search-then-answer
    trajectories must come back token for token), mis-scoring or mis-grouping per data_source, and reports that
    leave out the issue's keys, the intervals, the chart or the trajectories."""
    out, done = one_shot
    _, tokenizer, _, responses, _ = policy
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"overall", "by_source"} and set(results["by_source"]) == {"src_a", "src_b"}
    for name, s in results["by_source"].items():
        assert set(s) == SOURCE_KEYS, name
        assert (s["n"], s["em"], s["subem"], s["f1"]) == (2, 0.5, 0.5, 0.5)
        assert (s["searches"], s["turns"], s["stop_reasons"]) == (1.0, 2.0, {"answered": 2})
        assert s["em_ci"] == [0.0, 1.0] and s["f1_ci"] == [0.0, 1.0]  # bootstrap of [1, 0]: both ends reachable
    overall = results["overall"]
    assert SOURCE_KEYS <= set(overall) and overall["n"] == 4 and overall["em"] == 0.5 and overall["macro_em"] == 0.5
    assert overall["em_ci"][0] < 0.5 < overall["em_ci"][1]
    records = [json.loads(line) for line in _lines(out)]
    assert [(r["row"], r["sample"], r["data_source"]) for r in records] == [(i, 0, s) for i, (s, _, _) in
                                                                          enumerate(ROWS)]
    expected = {FRANCE: responses[0], TOKYO: responses[1]}
    for record, (_, question, golden) in zip(records, ROWS, strict=True):
        assert record["response"] == tokenizer.decode(expected[question], skip_special_tokens=True)
        assert record["golden"] == golden and record["stop_reason"] == "answered"
    assert [r["em"] for r in records] == [1.0, 0.0, 1.0, 0.0]
    markdown = (out / "results.md").read_text()
    assert "| src_a | 2 | 0.500 | [0.000, 1.000] |" in markdown and "answered 2" in markdown
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| **overall** | 4 | 0.500 |" in done.stdout and "evaluate" in done.stderr  # table, progress bar


def test_interrupted_evaluation_resumes_without_redoing_rows(one_shot, policy, test_parquet, service_url, tmp_path):
    """Guards against a rerun redoing (or duplicating) rows already written, choking on the torn line a killed run
    leaves, resuming under other settings, or reporting differently from an uninterrupted run."""
    out = tmp_path / "resumed"
    assert main(_argv(policy, test_parquet, service_url, out, "--limit", "2")) == 0
    first = _lines(out)
    assert [json.loads(line)["row"] for line in first] == [0, 1]
    assert json.loads((out / "results.json").read_text())["overall"]["n"] == 2
    with (out / "trajectories.jsonl").open("a") as f:
        f.write('{"row": 2, "sample": 0, "data_sou')  # killed mid-write
    assert main(_argv(policy, test_parquet, service_url, out)) == 0
    lines = _lines(out)
    assert lines[:2] == first  # not rewritten
    assert [json.loads(line)["row"] for line in lines] == [0, 1, 2, 3]  # torn row redone once, nothing twice
    one_shot_out, _ = one_shot
    assert (out / "results.json").read_text() == (one_shot_out / "results.json").read_text()
    assert main(_argv(policy, test_parquet, service_url, out, "reward.normalize=unicode")) == 2
    assert len(_lines(out)) == 4


def test_evaluation_scores_with_reward_normalize(policy, test_parquet, service_url, tmp_path):
    """Guards against the evaluation ignoring reward.normalize: the curly-quoted golden answer counts only under
    unicode, so src_a goes from 0.5 to 1.0."""
    out = tmp_path / "unicode"
    assert main(_argv(policy, test_parquet, service_url, out, "reward.normalize=unicode")) == 0
    by_source = json.loads((out / "results.json").read_text())["by_source"]
    assert by_source["src_a"]["em"] == 1.0 and by_source["src_b"]["em"] == 0.5


def test_sampling_n_per_question_reports_pass_at_k(policy, test_parquet, service_url, tmp_path):
    """Guards against --n sampling fewer or more trajectories than asked, or pass@k being computed per trajectory
    instead of per question."""
    out = tmp_path / "sampled"
    assert main(_argv(policy, test_parquet, service_url, out, "--n", "3", "--temperature", "0.5", "--seed", "1")) == 0
    records = [json.loads(line) for line in _lines(out)]
    assert sorted((r["row"], r["sample"]) for r in records) == [(i, k) for i in range(4) for k in range(3)]
    results = json.loads((out / "results.json").read_text())
    for name, s in results["by_source"].items():
        rows = {r["row"] for r in records if r["data_source"] == name}
        any_exact = [max(r["em"] for r in records if r["row"] == row) for row in rows]
        assert s["k"] == 3 and s["n"] == 2
        assert s["pass_at_k"] == sum(any_exact) / 2
        assert s["em"] == pytest.approx(sum(r["em"] for r in records if r["data_source"] == name) / 6)


def test_bad_inputs_are_named(policy, test_parquet, service_url, unused_url, tmp_path, capsys):
    """Guards against obscure failures (tracebacks, KeyErrors mid-run, hangs) on a missing model directory, a parquet
    without the Search-R1 columns, or a retrieval service that is not running."""
    no_model = tmp_path / "no_model"
    assert main(["--model", str(no_model), "--data", str(test_parquet), "--out", str(tmp_path / "o1")]) == 2
    assert f"--model {no_model}: no such directory" in capsys.readouterr().err
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"data_source": ["x"], "prompt": [[{"role": "user", "content": "q"}]]}), bad)
    assert main(_argv(policy, bad, service_url, tmp_path / "o2")) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "missing column(s) reward_model" in err
    assert main(_argv(policy, test_parquet, unused_url, tmp_path / "o3")) == 2
    err = capsys.readouterr().err
    assert unused_url in err and "retrieval_launch.sh" in err


def test_trajectories_are_the_trainers_trajectory_records(one_shot, policy):
    """Guards against the evaluation's trajectories.jsonl and the trainer's trajectory files drifting apart (issue
    57's item 2: the viewer reads both): every record has the contract's fields; the memorised trajectory is a
    policy turn, the inserted <information> block of its one search, and the answering turn."""
    out, _ = one_shot
    for record, (_, question, golden) in zip(map(json.loads, _lines(out)), ROWS, strict=True):
        check_record(record, "test")
        assert (record["step"], record["uid"], record["group"], record["index"]) == \
            (None, f"row{record['row']}-0", f"row{record['row']}", record["row"])
        assert record["queries"] == [QUESTIONS[question][0]] and record["ground_truth"] == golden
        assert [s["kind"] for s in record["segments"]] == ["policy", "inserted", "policy"]
        assert "<information>" in record["segments"][1]["text"] and question in record["input"]
        assert record["score"] == record["em"] and record["reward_terms"] == {
            "em": record["em"], "subem": record["subem"], "f1": record["f1"]}
