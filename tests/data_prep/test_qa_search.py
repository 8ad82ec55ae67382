"""Tests of the real-data preparation: FlashRAG JSONL -> Search-R1 parquet, merging, bad rows, specs, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_prep.qa_search import (
    FLASHRAG_BENCHMARKS,
    PARQUET_SCHEMA,
    BadRowError,
    SourceSpec,
    build_split,
    load_source,
    main,
    make_row,
    parse_source_spec,
    rows_to_parquet,
)
from search_r1.prompts import INSTRUCTION, make_prompt
from search_r1.reward import compute_score

REPO_ROOT = Path(__file__).resolve().parents[2]


def _write_jsonl(path: Path, records: list[dict | str]) -> Path:
    """Records as JSON lines; a str record is written verbatim (for blank or broken lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


NQ_RECORDS = [
    {"id": "nq-0", "question": "who wrote hamlet", "golden_answers": ["William Shakespeare", "Shakespeare"]},
    {"id": "nq-1", "question": "  capital of France?  ", "golden_answers": ["Paris"]},
    {"id": "nq-2", "question": "année de la prise de la Bastille", "golden_answers": [1789]},
]
HOTPOT_RECORDS = [
    {"id": "hq-0", "question": "Which band came first, Blur or Oasis", "golden_answers": ["Blur"]},
]


def test_round_trip_schema_and_values(tmp_path: Path) -> None:
    """Guards against schema drift (types, nesting) and against values changing between JSONL and parquet."""
    source = SourceSpec("nq", path=_write_jsonl(tmp_path / "nq.jsonl", NQ_RECORDS))
    rows, skipped = load_source(source, "train")
    rows_to_parquet(rows, tmp_path / "out" / "train.parquet")
    table = pq.read_table(tmp_path / "out" / "train.parquet")
    assert skipped == 0
    assert table.schema.equals(PARQUET_SCHEMA)
    back = table.to_pylist()
    assert len(back) == len(NQ_RECORDS)
    for i, (row, record) in enumerate(zip(back, NQ_RECORDS, strict=True)):
        assert row["data_source"] == "nq"
        assert row["prompt"] == [{"role": "user", "content": make_prompt(record["question"])}]
        assert row["ability"] == "fact-reasoning"
        assert row["reward_model"] == {"style": "rule",
                                       "ground_truth": {"target": [str(a) for a in record["golden_answers"]]}}
        assert row["extra_info"] == {"split": "train", "index": i}
    assert back[2]["prompt"][0]["content"].endswith("année de la prise de la Bastille?\n")  # non-ASCII intact


def test_parquet_ground_truth_scores_via_pandas(tmp_path: Path) -> None:
    """Guards against the reward failing on what the trainer reads back (pandas gives numpy arrays of strings)."""
    rows_to_parquet([make_row("nq", "who wrote hamlet", ["William Shakespeare", "Shakespeare"], "test", 0)],
                    tmp_path / "t.parquet")
    ground_truth = pq.read_table(tmp_path / "t.parquet").to_pandas()["reward_model"][0]["ground_truth"]
    assert compute_score("nq", "<answer>shakespeare</answer>", ground_truth) == 1.0
    assert compute_score("nq", "<answer>Marlowe</answer>", ground_truth) == 0.0


@pytest.mark.parametrize("question", ["What is X", "What is X?", "  What is X?\n "])
def test_question_mark_added_once(question: str) -> None:
    """Guards against a doubled '??' or leftover whitespace in the prompt's question."""
    content = make_row("nq", question, ["x"], "train", 0)["prompt"][0]["content"]
    assert content == INSTRUCTION + "What is X?\n"


def test_merge_keeps_data_source(tmp_path: Path) -> None:
    """Guards against merged sources losing their data_source (validation EM is reported per source)."""
    specs = [SourceSpec("nq", path=_write_jsonl(tmp_path / "nq.jsonl", NQ_RECORDS)),
             SourceSpec("hotpotqa", path=_write_jsonl(tmp_path / "hq.jsonl", HOTPOT_RECORDS))]
    rows, skipped = build_split(specs, "train")
    rows_to_parquet(rows, tmp_path / "train.parquet")
    back = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert [r["data_source"] for r in back] == ["nq", "nq", "nq", "hotpotqa"]
    assert [r["extra_info"]["index"] for r in back] == [0, 1, 2, 0]
    assert back[3]["reward_model"]["ground_truth"]["target"] == ["Blur"]
    assert skipped == {"nq": 0, "hotpotqa": 0}


BAD_RECORDS = [
    {"id": "ok-0", "question": "q zero", "golden_answers": ["a"]},
    "",  # blank line: ignored, not a record
    {"id": "no-question", "golden_answers": ["a"]},
    {"id": "ok-1", "question": "q one", "golden_answers": ["b"]},
    {"id": "empty-answers", "question": "q two", "golden_answers": []},
    {"id": "blank-answers", "question": "q three", "golden_answers": ["", "  "]},
    "{not json",
    {"id": "ok-2", "question": "q four", "golden_answers": ["c", ""]},
]


@pytest.mark.parametrize(
    ("records", "pattern"),
    [
        (BAD_RECORDS[:3], r"bad\.jsonl:3: bad row \(id='no-question'\): missing or empty question"),
        ([BAD_RECORDS[0], BAD_RECORDS[4]], r"bad\.jsonl:2: bad row \(id='empty-answers'\): no non-empty golden"),
        ([BAD_RECORDS[5]], r"bad\.jsonl:1: bad row \(id='blank-answers'\)"),
        ([BAD_RECORDS[0], BAD_RECORDS[6]], r"bad\.jsonl:2: bad row \(id=None\): invalid JSON"),
    ],
)
def test_bad_row_error_names_line_and_id(tmp_path: Path, records: list, pattern: str) -> None:
    """Guards against a bad record crashing deep inside with no hint of which line/id of which file is wrong."""
    spec = SourceSpec("nq", path=_write_jsonl(tmp_path / "bad.jsonl", records))
    with pytest.raises(BadRowError, match=pattern):
        load_source(spec, "train")


def test_skip_bad_counts_and_keeps_source_index(tmp_path: Path) -> None:
    """Guards against --skip-bad miscounting or renumbering kept rows (index must point back to the source)."""
    spec = SourceSpec("nq", path=_write_jsonl(tmp_path / "bad.jsonl", BAD_RECORDS))
    rows, skipped = load_source(spec, "test", skip_bad=True)
    assert skipped == 4
    assert [r["extra_info"]["index"] for r in rows] == [0, 2, 6]
    assert [r["reward_model"]["ground_truth"]["target"] for r in rows] == [["a"], ["b"], ["c"]]
    assert {r["extra_info"]["split"] for r in rows} == {"test"}


def test_rows_to_parquet_rejects_unknown_keys(tmp_path: Path) -> None:
    """Guards against pyarrow silently dropping a field that a caller (e.g. the demo generator) added."""
    row = make_row("demo_x", "q", ["a"], "train", 0)
    row["extra_info"]["doc_id"] = "d1"
    with pytest.raises(ValueError, match="row 0 extra_info"):
        rows_to_parquet([row], tmp_path / "x.parquet")


def test_make_row_rejects_bad_answers() -> None:
    """Guards against a dict or number of answers being iterated into nonsense targets."""
    with pytest.raises(ValueError, match="must be a string or a list"):
        make_row("nq", "q", {"a": 1}, "train", 0)  # type: ignore[arg-type]
    assert make_row("nq", "q", "Paris", "train", 0)["reward_model"]["ground_truth"]["target"] == ["Paris"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("nq=data/nq_train.jsonl", SourceSpec("nq", path=Path("data/nq_train.jsonl"))),
        ("hotpotqa=hf:RUC-NLPIR/FlashRAG_datasets/hotpotqa:train",
         SourceSpec("hotpotqa", hf_dataset="RUC-NLPIR/FlashRAG_datasets", hf_config="hotpotqa", hf_split="train")),
        ("nq=hf:google-research-datasets/nq_open:validation",
         SourceSpec("nq", hf_dataset="google-research-datasets/nq_open", hf_split="validation")),
        ("squad=hf:squad:train[:100]", SourceSpec("squad", hf_dataset="squad", hf_split="train[:100]")),
    ],
)
def test_parse_source_spec(spec: str, expected: SourceSpec) -> None:
    """Guards against mixing up dataset id, config and split in the hf: spec."""
    assert parse_source_spec(spec) == expected


@pytest.mark.parametrize("spec", ["nq", "=x.jsonl", "nq=", "n q=x", "nq=hf:owner/data", "nq=hf::train",
                                  "nq=hf:a/b/c/d:train", "nq=hf:a//c:train"])
def test_parse_source_spec_rejects(spec: str) -> None:
    """Guards against a malformed spec being read as a file path or a dataset with an empty part."""
    with pytest.raises(ValueError, match="bad"):
        parse_source_spec(spec)


def _run_cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf_home")}
    return subprocess.run([sys.executable, "-m", "data_prep.qa_search", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_merges_train_and_test(tmp_path: Path) -> None:
    """Guards against the CLI entry point (argparse, repeated --train, output layout) drifting from the library."""
    nq = _write_jsonl(tmp_path / "nq.jsonl", NQ_RECORDS)
    hq = _write_jsonl(tmp_path / "hq.jsonl", HOTPOT_RECORDS)
    result = _run_cli(["--train", f"nq={nq}", "--train", f"hotpotqa={hq}", "--test", f"nq={nq}",
                       "--out", "data/nq_hotpotqa"], tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "data" / "nq_hotpotqa"
    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    assert [r["data_source"] for r in train] == ["nq", "nq", "nq", "hotpotqa"]
    assert [r["extra_info"]["split"] for r in test] == ["test"] * 3
    assert "train: 4 rows, 0 skipped" in result.stdout


def test_cli_bad_row_and_skip_bad(tmp_path: Path) -> None:
    """Guards against the CLI hiding which row is bad, or --skip-bad not reaching the loader."""
    bad = _write_jsonl(tmp_path / "bad.jsonl", BAD_RECORDS)
    good = _write_jsonl(tmp_path / "good.jsonl", HOTPOT_RECORDS)
    failed = _run_cli(["--train", f"hotpotqa={good}", "--test", f"nq={bad}", "--out", "out"], tmp_path)
    assert failed.returncode == 2
    assert "bad.jsonl:3: bad row (id='no-question')" in failed.stderr
    assert "--skip-bad" in failed.stderr
    assert not (tmp_path / "out").exists()  # the good train split is not written either
    ok = _run_cli(["--train", f"nq={bad}", "--out", "out", "--skip-bad"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "train: 3 rows, 4 skipped" in ok.stdout
    assert pq.read_table(tmp_path / "out" / "train.parquet").num_rows == 3


def test_cli_failing_hf_load_is_clear(tmp_path: Path) -> None:
    """Guards against an unreachable Hugging Face dataset ending in an opaque traceback instead of one message."""
    result = _run_cli(["--test", "nq=hf:no-such-owner/no-such-dataset/nq:test", "--out", "out"], tmp_path)
    assert result.returncode == 2
    assert ("could not load Hugging Face dataset 'no-such-owner/no-such-dataset' config 'nq' split 'test'"
            in result.stderr)
    assert "Traceback" not in result.stderr


# FlashRAG's splits per benchmark (its dataset repository): no test.jsonl for hotpotqa, 2wikimultihopqa, musique.
FLASHRAG_SPLITS = {"nq": ("train", "dev", "test"), "triviaqa": ("train", "dev", "test"), "popqa": ("test",),
                   "hotpotqa": ("train", "dev"), "2wikimultihopqa": ("train", "dev"), "musique": ("train", "dev"),
                   "bamboogle": ("test",)}
# One record per benchmark in its own style (ids, metadata shapes and answer lists as FlashRAG writes them).
FLASHRAG_RECORDS = {
    "nq": {"id": "test_0", "question": "who got the first nobel prize in physics",
           "golden_answers": ["Wilhelm Conrad Röntgen"], "metadata": {}},
    "triviaqa": {"id": "test_1", "question": "Who was the man behind The Chipmunks?",
                 "golden_answers": ["David Seville", "Ross Bagdasarian"], "metadata": {}},
    "popqa": {"id": "4222632", "question": "What is George Rankin's occupation?",
              "golden_answers": ["politician", "political leader"],
              "metadata": {"s_wiki_title": "George Rankin", "prop": "occupation"}},
    "hotpotqa": {"id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same "
                 "nationality?", "golden_answers": ["yes"], "metadata": {"type": "comparison", "level": "hard"}},
    "2wikimultihopqa": {"id": "8813f87c0bdd11eba7f7acde48001122", "question": "Who is the mother of the director "
                        "of film Polish-Russian War (Film)?", "golden_answers": ["Małgorzata Braunek"],
                        "metadata": {"type": "compositional", "evidences": [["x", "director", "y"]]}},
    "musique": {"id": "2hop__13548_13529", "question": "When was the person who Messi's goals in Copa del Rey "
                "compared to get signed by Barcelona?", "golden_answers": ["June 1982", "1982"],
                "metadata": {"answerable": True}},
    "bamboogle": {"id": "test_0", "question": "Who was president of the United States in the year that Citibank "
                  "was founded?", "golden_answers": ["james madison"], "metadata": {}},
}


def _flashrag_dir(root: Path) -> Path:
    """A FlashRAG dataset directory: <root>/<name>/<split>.jsonl, two records per file, questions tagged by split."""
    for name, splits in FLASHRAG_SPLITS.items():
        for split in splits:
            base = FLASHRAG_RECORDS[name]
            records = [{**base, "id": f"{base['id']}-{split}-{i}", "question": f"{base['question']} ({split} {i})"}
                       for i in range(2)]
            (root / name).mkdir(parents=True, exist_ok=True)
            _write_jsonl(root / name / f"{split}.jsonl", records)
    return root


def test_flashrag_directory_gives_the_seven_benchmarks_per_split(tmp_path: Path) -> None:
    """Guards against a benchmark missing from a split, a split file read into the wrong split, lost golden answers,
    and the three benchmarks without test.jsonl being left out of test.parquet (Search-R1 tests them on dev)."""
    root = _flashrag_dir(tmp_path / "flashrag")
    assert main(["--flashrag", str(root), "--out", str(tmp_path / "out")]) == 0
    tables = {split: pq.read_table(tmp_path / "out" / f"{split}.parquet").to_pylist()
              for split in ("train", "dev", "test")}
    for split, rows in tables.items():
        expected = {n for n, splits in FLASHRAG_SPLITS.items() if split in splits or
                    (split == "test" and "dev" in splits)}
        assert {r["data_source"] for r in rows} == expected, split
        for row in rows:
            name = row["data_source"]
            source_split = split if split in FLASHRAG_SPLITS[name] else "dev"
            assert row["extra_info"]["split"] == source_split
            assert f"({source_split} {row['extra_info']['index']})?" in row["prompt"][0]["content"]
            assert row["reward_model"]["ground_truth"]["target"] == FLASHRAG_RECORDS[name]["golden_answers"]
    assert len(tables["test"]) == 2 * len(FLASHRAG_BENCHMARKS)


def test_flashrag_names_and_missing_folders_are_clear(tmp_path: Path, capsys) -> None:
    """Guards against a misspelt benchmark or a missing download being skipped silently."""
    root = _flashrag_dir(tmp_path / "flashrag")
    assert main(["--flashrag", str(root), "--datasets", "nq", "hotpot", "--out", str(tmp_path / "o")]) == 2
    assert "unknown FlashRAG benchmark(s) ['hotpot']; choose among nq, triviaqa" in capsys.readouterr().err
    (root / "musique" / "train.jsonl").unlink()
    (root / "musique" / "dev.jsonl").unlink()
    assert main(["--flashrag", str(root), "--out", str(tmp_path / "o")]) == 2
    assert f"{root / 'musique'} holds none of train.jsonl, dev.jsonl, test.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert main(["--flashrag", str(root), "--datasets", "bamboogle", "popqa", "--out", str(tmp_path / "o")]) == 0
    sources = [r["data_source"] for r in pq.read_table(tmp_path / "o" / "test.parquet").to_pylist()]
    assert sources == ["bamboogle"] * 2 + ["popqa"] * 2


def test_template_file_sets_the_prompt(tmp_path: Path, capsys) -> None:
    """Guards against --template being ignored, the question not reaching its placeholder, other braces in the
    template (e.g. a JSON example) breaking it, and a template without the placeholder passing unnoticed."""
    template = tmp_path / "paper.txt"
    template.write_text('Answer {"like": "this"}.\nQuestion: {question}\n', encoding="utf-8")
    source = _write_jsonl(tmp_path / "nq.jsonl", NQ_RECORDS[:2])
    out = tmp_path / "out"
    assert main(["--test", f"nq={source}", "--template", str(template), "--out", str(out)]) == 0
    prompts = [r["prompt"][0]["content"] for r in pq.read_table(out / "test.parquet").to_pylist()]
    assert prompts == ['Answer {"like": "this"}.\nQuestion: who wrote hamlet?\n',
                       'Answer {"like": "this"}.\nQuestion: capital of France?\n']
    template.write_text("Answer the question: {q}\n", encoding="utf-8")
    assert main(["--test", f"nq={source}", "--template", str(template), "--out", str(tmp_path / "o2")]) == 2
    assert f"prompt template {template} has no {{question}} placeholder" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()
