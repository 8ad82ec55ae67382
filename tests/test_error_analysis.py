"""benchmarks/error_analysis.py: errors split by evidence, in both action formats, from any evaluation directory."""

import json

import pytest

from benchmarks import error_analysis  # noqa: E402  (a namespace package: the repository root is on sys.path)

PASSAGES = ("Doc 1(Title: Lithbrar) The Lithbrar was built by Gemlon Works in 1755.\n"
            "Doc 2(Title: Neitherstead) Neitherstead is a river town in Droxbath, home of the Lithbrar.")


def tag(answer: str, passages: str = PASSAGES) -> str:
    return f"<search> Lithbrar </search>\n\n<information>{passages}</information>\n\n<answer> {answer} </answer>"


def hermes(answer: str, passages: str = PASSAGES) -> str:
    return ('<tool_call>{"name": "search", "arguments": {"query": "Lithbrar"}}</tool_call>\ntool\n'
            f"<tool_response>\n{passages}\n</tool_response>\nassistant\n<answer> {answer} </answer>")


def record(source: str, response: str, answer: str, golden: list[str]) -> dict:
    em = float(any(answer.lower() == g.lower() for g in golden))
    return {"data_source": source, "response": response, "answer": answer, "golden": golden, "em": em}


def write_eval(path, records):
    path.mkdir(parents=True)
    (path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("render", [tag, hermes], ids=["tag", "hermes"])
def test_each_error_kind_is_counted_once(tmp_path, render):
    gold = ["Gemlon Works"]
    records = [
        record("demo_single", render("Gemlon Works"), "Gemlon Works", gold),  # right
        record("demo_single", render("Neitherstead"), "Neitherstead", gold),  # misread: another name it read
        record("demo_single", render("Droxbath Mill"), "Droxbath Mill", gold),  # misread: a name it did not read
        record("demo_single", render("Gemlon Works", "Doc 1(Title: Other) Nothing here."), "Gemlon Works", gold),
        record("demo_single", render("Nobody", "Doc 1(Title: Other) Nothing here."), "Nobody", gold),  # missed
        record("demo_multi", render("Gemlon Works"), "Gemlon Works", gold),
    ]
    path = write_eval(tmp_path / "eval", records)
    one_hop = error_analysis.shares(path / "trajectories.jsonl", "demo_single")
    assert one_hop.row() == pytest.approx((2 / 5, 3 / 5, 2 / 5, 1 / 5, 1 / 5))
    assert error_analysis.shares(path / "trajectories.jsonl", "demo_multi").row() == (1.0, 1.0, 0.0, 0.0, 0.0)


def test_runs_table_averages_over_seeds(tmp_path, capsys):
    gold = ["Gemlon Works"]
    right = [record(s, tag("Gemlon Works"), "Gemlon Works", gold) for s in ("demo_single", "demo_multi")]
    wrong = [record(s, tag("Neitherstead"), "Neitherstead", gold) for s in ("demo_single", "demo_multi")]
    a = write_eval(tmp_path / "s1", right)
    b = write_eval(tmp_path / "s2", wrong)
    error_analysis.main(["--runs", f"grpo={a},{b}", f"one={a}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("| grpo | one-hop | 0.500 +/- 0.707 | 1.000 +/- 0.000 | 0.500 +/- 0.707 | 0.500 +/- 0.707 "
                        "| 0.000 +/- 0.000 | 2 |")
    assert lines[4].startswith("| one | one-hop | 1.000 +/- 0.000 |") and lines[4].endswith("| 1 |")


def test_bad_run_specs_name_what_is_wrong(tmp_path):
    with pytest.raises(SystemExit, match="expected LABEL=EVAL_DIR"):
        error_analysis.main(["--runs", str(tmp_path)])
    with pytest.raises(SystemExit, match="no trajectories.jsonl"):
        error_analysis.main(["--runs", f"x={tmp_path}"])
