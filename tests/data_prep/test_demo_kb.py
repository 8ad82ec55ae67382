"""Tests of the demo knowledge base: determinism, split by entity, schema, answers in the corpus, chains."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from data_prep.demo_kb import MULTI, SINGLE, build_kb, load_questions, main

SMALL = {"seed": 3, "n_groups": 60, "n_test_groups": 10, "questions_per_group": 2}


@pytest.fixture(scope="module")
def kb_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    assert main(["--out", str(out), "--seed", "3", "--n-groups", "60", "--n-test-groups", "10"]) == 0
    return out


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_same_seed_same_world_and_other_seed_other_world():
    """Guards against hidden randomness (set order, global RNG) making the demo data differ between runs."""
    a_entities, a_questions = build_kb(**SMALL)
    b_entities, b_questions = build_kb(**SMALL)
    assert [e.contents() for e in a_entities] == [e.contents() for e in b_entities]
    assert [q.question for q in a_questions] == [q.question for q in b_questions]
    c_entities, _ = build_kb(**{**SMALL, "seed": 4})
    assert [e.contents() for e in a_entities] != [e.contents() for e in c_entities]


def test_files_are_byte_identical_across_runs(kb_dir, tmp_path):
    """Guards against non-deterministic file output (e.g. parquet rows or corpus lines in a varying order)."""
    assert main(["--out", str(tmp_path), "--seed", "3", "--n-groups", "60", "--n-test-groups", "10"]) == 0
    for name in ("corpus.jsonl", "questions.jsonl"):
        assert (tmp_path / name).read_bytes() == (kb_dir / name).read_bytes()
    for name in ("train.parquet", "test.parquet"):
        assert pd.read_parquet(tmp_path / name).to_json() == pd.read_parquet(kb_dir / name).to_json()


def test_names_are_unique_and_fictional():
    """Guards against name collisions: two entities sharing a name word would make BM25 ambiguous and let a
    test answer be learned from training data."""
    entities, _ = build_kb(**SMALL)
    cores = [e.name.split()[-1] if e.kind == "person" else e.name.split()[0] for e in entities]
    assert len(cores) == len(set(cores))
    assert len({e.name for e in entities}) == len(entities)
    template_words = {"the", "was", "born", "founded", "by", "built", "written", "based", "guild", "company"}
    assert not template_words & {c.lower() for c in cores}


def test_split_by_entity_no_test_entity_in_train_questions(kb_dir):
    """Guards against leakage: a test answer or test entity that appears in a training question (or answer)
    could be memorised, so test EM would not measure retrieval."""
    questions = load_questions(kb_dir)
    train = [q for q in questions if q.split == "train"]
    test = [q for q in questions if q.split == "test"]
    assert train and test
    assert not {q.group for q in train} & {q.group for q in test}
    train_text = " ".join(q.question + " " + " ".join(q.answers) for q in train)
    for q in test:
        names = set(q.answers) | {h.query for h in q.chain} | {h.answer for h in q.chain}
        for name in names:
            assert name not in train_text, f"test entity {name!r} appears in the training questions"


def test_parquet_schema_and_sources(kb_dir):
    """Guards against rows that the trainer's dataset cannot read (Search-R1 schema) or an unbalanced mix."""
    for split, n in (("train", 100), ("test", 20)):
        df = pd.read_parquet(kb_dir / f"{split}.parquet")
        assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert len(df) == n
        assert set(df.data_source) == {SINGLE, MULTI}
        assert (df.data_source == SINGLE).sum() == n // 2
        row = df.iloc[0]
        assert row.prompt[0]["role"] == "user" and row.prompt[0]["content"].endswith("?\n")
        assert row.reward_model["style"] == "rule"
        assert len(row.reward_model["ground_truth"]["target"]) >= 2  # main name + alias
        assert row.extra_info["split"] == split
        assert list(df.extra_info.map(lambda e: e["index"])) == list(range(n))


def test_answers_and_chains_resolve_in_the_corpus(kb_dir):
    """Guards against unanswerable questions: every hop's query must be a passage title whose text states the
    hop (the same words the scripted agent restates), chains must link, and the final hop gives the answer."""
    corpus = {}
    with (kb_dir / "corpus.jsonl").open() as f:
        for line in f:
            doc = json.loads(line)
            title, _, text = doc["contents"].partition("\n")
            corpus[title.strip('"')] = text
    for q in load_questions(kb_dir):
        assert len(q.chain) == (1 if q.data_source == SINGLE else 2)
        for hop, nxt in zip(q.chain[:-1], q.chain[1:], strict=True):
            assert nxt.query == hop.answer
        for hop in q.chain:
            text = corpus[hop.query]
            assert hop.answer in text
            # the restated fact minus its subject is said in the passage (e.g. "founded by X")
            relation_words = hop.statement.rstrip(".").split(" ")
            assert " ".join(relation_words[-(len(hop.answer.split()) + 2):]) in text
        assert q.chain[-1].answer == q.answers[0]
        assert q.answers[0] in " ".join(corpus.values())
        assert _words(q.chain[0].query) <= _words(q.question)
