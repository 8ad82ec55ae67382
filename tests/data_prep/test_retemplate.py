"""data_prep.retemplate: a tag-format QA parquet made again under the hermes prompt, every other column kept; a
row not made from the source template is an error naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_prep.qa_search import SourceSpec, load_source, rows_to_parquet
from data_prep.retemplate import main, retemplate_parquet
from search_r1.prompts import DEFAULT_TEMPLATE, HERMES_TEMPLATE, make_prompt, question_of

RECORDS = [{"id": "q0", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]},
           {"id": "q1", "question": "Which band came first, Blur or Oasis?", "golden_answers": ["Blur"]}]


def _tag_parquet(tmp_path: Path) -> Path:
    source = tmp_path / "qa.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    rows, _ = load_source(SourceSpec("nq", path=source), "train")
    rows_to_parquet(rows, tmp_path / "train.parquet")
    return tmp_path / "train.parquet"


def test_hermes_prompts_and_other_columns_kept(tmp_path: Path) -> None:
    data = _tag_parquet(tmp_path)
    out = retemplate_parquet(data, tmp_path / "hermes" / "train.parquet", "hermes")
    before, after = pq.read_table(data), pq.read_table(out)
    assert after.schema.equals(before.schema)
    for old, new, record in zip(before.to_pylist(), after.to_pylist(), RECORDS, strict=True):
        (message,) = [m for m in new["prompt"] if m["role"] == "user"]
        assert message["content"] == make_prompt(record["question"], HERMES_TEMPLATE)
        assert question_of(message["content"], HERMES_TEMPLATE) == question_of(old["prompt"][0]["content"])
        assert {k: v for k, v in new.items() if k != "prompt"} == {k: v for k, v in old.items() if k != "prompt"}
    # back to tags gives the source again
    back = retemplate_parquet(out, tmp_path / "back.parquet", "search_r1", source_template=HERMES_TEMPLATE)
    assert pq.read_table(back).to_pylist() == before.to_pylist()


def test_foreign_prompt_is_an_error_naming_the_row(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = _tag_parquet(tmp_path)
    hermes = retemplate_parquet(data, tmp_path / "hermes.parquet", "hermes")
    # hermes prompts were not made from the tag template: refused, not passed through
    with pytest.raises(SystemExit, match=r"row 0: prompt .* was not made from the given source template"):
        main(["--format", "hermes", "--data", str(hermes), "--out", str(tmp_path / "again.parquet")])
    assert not (tmp_path / "again.parquet").exists()
    with pytest.raises(ValueError, match="unknown action format 'openai'; allowed: hermes, search_r1"):
        retemplate_parquet(data, tmp_path / "x.parquet", "openai")
    main(["--format", "hermes", "--data", str(data), "--out", str(tmp_path / "ok.parquet")])
    assert "wrote" in capsys.readouterr().out
    assert question_of(pq.read_table(tmp_path / "ok.parquet").to_pylist()[0]["prompt"][0]["content"],
                       DEFAULT_TEMPLATE) is None
