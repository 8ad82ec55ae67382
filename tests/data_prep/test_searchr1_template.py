"""``data_prep.qa_search --template-from-searchr1 CHECKOUT``: Search-R1's own prompt, read from a checkout laid out
as Search-R1's, recorded with its source and sha256 beside the parquet.

Guards against issue 57's item 1: the default prompt is this project's wording, not Search-R1's ``make_prefix``,
and nothing let a user who compares with Search-R1's numbers train on Search-R1's prompt without copying it by hand.
The fake checkout's prompt is made up here (the project never holds Search-R1's text); its script would fail if it
were executed, so the test also shows it is only parsed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_prep.qa_search import main
from data_prep.searchr1_template import TemplateSourceError, read_searchr1_template
from search_r1.prompts import make_prompt

# A made-up prompt in the layout of Search-R1's scripts/data_process/nq_search.py: make_prefix(dp, template_type)
# assigns a triple-quoted f-string with line continuations to `prefix` under `if template_type == 'base'`.
FAKE_SCRIPT = '''
import re
import os
import datasets  # would fail here: the script must be parsed, not run

raise SystemExit("the checkout's script was executed")


def make_prefix(dp, template_type):
    question = dp['question']

    # NOTE: a comment, as the original has
    if template_type == 'base':
        """A docstring-like string inside the branch."""
        prefix = f"""Zorblat the query. Ponder in <think> and </think>. \\
Fetch facts with <search> words </search>; they come back in <information> and </information>. \\
Reply in <answer> and </answer>, e.g. <answer> Quux </answer>. Query: {question}\\n"""
    else:
        raise NotImplementedError
    return prefix


if __name__ == '__main__':
    dataset = datasets.load_dataset('RUC-NLPIR/FlashRAG_datasets', 'nq')
'''
MADE_UP = ("Zorblat the query. Ponder in <think> and </think>. Fetch facts with <search> words </search>; they come "
           "back in <information> and </information>. Reply in <answer> and </answer>, e.g. <answer> Quux </answer>. "
           "Query: {question}\n")


def fake_checkout(root: Path, script: str = FAKE_SCRIPT) -> Path:
    (root / "scripts" / "data_process").mkdir(parents=True)
    (root / "scripts" / "data_process" / "nq_search.py").write_text(script)
    return root


def test_the_prompt_is_read_from_the_checkout_and_recorded_with_its_sha256(tmp_path, capsys):
    checkout = fake_checkout(tmp_path / "Search-R1")
    source = tmp_path / "nq.jsonl"
    source.write_text(json.dumps({"id": "0", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}) + "\n")
    out = tmp_path / "data"
    assert main(["--train", f"nq={source}", "--test", f"nq={source}", "--out", str(out),
                 "--template-from-searchr1", str(checkout)]) == 0
    script = checkout / "scripts" / "data_process" / "nq_search.py"
    for split in ("train", "test"):
        (row,) = pq.read_table(out / f"{split}.parquet").to_pylist()
        assert row["prompt"] == [{"role": "user", "content": MADE_UP.replace("{question}", "who wrote hamlet?")}]
    record = json.loads((out / "prompt.json").read_text())
    assert record == {"template": MADE_UP, "source": "Search-R1's make_prefix (template_type 'base')",
                      "path": str(script.resolve()), "sha256": hashlib.sha256(script.read_bytes()).hexdigest()}
    assert f"prompt: Search-R1's make_prefix (template_type 'base') {script.resolve()}" in capsys.readouterr().out


def test_the_default_prompt_is_recorded_too(tmp_path):
    source = tmp_path / "nq.jsonl"
    source.write_text(json.dumps({"id": "0", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}) + "\n")
    assert main(["--test", f"nq={source}", "--out", str(tmp_path / "data")]) == 0
    record = json.loads((tmp_path / "data" / "prompt.json").read_text())
    assert make_prompt("who wrote hamlet", record["template"]) == \
        pq.read_table(tmp_path / "data" / "test.parquet").to_pylist()[0]["prompt"][0]["content"]
    assert record["path"] is None and record["source"] == "search_r1.prompts (--format search_r1)"


@pytest.mark.parametrize("script, expected", [
    (None, "no scripts/data_process/nq_search.py in it (expected a checkout of Search-R1"),
    ("def make_prompt(dp, template_type):\n    return ''\n", "defines no function make_prefix(dp, template_type)"),
    ("def make_prefix(dp, template_type):\n    prefix = f'Q: {dp[\"question\"]} {template_type}'\n    return prefix\n",
     "make_prefix's f-string formats {template_type}, expected only the question"),
    ("def make_prefix(dp, template_type):\n    if template_type == 'instruct':\n"
     "        prefix = f'{dp[\"question\"]}'\n    return prefix\n",
     "expected make_prefix to assign one f-string to prefix for template_type == 'base'; found 0 "
     "(template types: instruct)"),
    ("def make_prefix(dp t):\n", "does not parse as Python"),
], ids=["no-script", "no-make_prefix", "other-value", "no-base", "syntax"])
def test_another_layout_is_refused_saying_what_was_expected(tmp_path, capsys, script, expected):
    checkout = tmp_path / "Search-R1"
    checkout.mkdir()
    if script is not None:
        fake_checkout(checkout, script)
    with pytest.raises(TemplateSourceError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        read_searchr1_template(checkout)
    source = tmp_path / "nq.jsonl"
    source.write_text(json.dumps({"id": "0", "question": "q", "golden_answers": ["a"]}) + "\n")
    out = tmp_path / "data"
    assert main(["--test", f"nq={source}", "--out", str(out), "--template-from-searchr1", str(checkout)]) == 2
    assert expected in capsys.readouterr().err and not out.exists()
