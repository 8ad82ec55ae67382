"""Corpus scanning / random access and the manifest checks, in-process (no server)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrieval_server.index.build import build_index
from retrieval_server.index.corpus import CorpusError, CorpusStore, iter_passages, parse_passage, scan_corpus
from retrieval_server.index.encoder import DEFAULT_MODEL, Encoder
from retrieval_server.index.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    check_corpus,
    check_corpus_size,
    check_encoder,
)


def test_scan_offsets_and_checksum_match_a_plain_read(tmp_path):
    """Guards against off-by-one offsets (CRLF, blank lines, no final newline) returning the wrong passage."""
    rows = [{"id": f"p{i}", "contents": f'"T{i}"\ntext ü {i}'} for i in range(5)]
    lines = [json.dumps(r) for r in rows]
    raw = lines[0] + "\r\n\n" + lines[1] + "\n   \n" + "\n".join(lines[2:])  # CRLF, blank lines, no final newline
    path = tmp_path / "c.jsonl"
    path.write_bytes(raw.encode())
    scan = scan_corpus(path)
    assert scan.sha256 == hashlib.sha256(raw.encode()).hexdigest()
    assert scan.n_bytes == len(raw.encode()) and scan.count == 5
    expected = [json.loads(line) for line in raw.splitlines() if line.strip()]  # plain loop reference
    store = CorpusStore(scan)
    fetched = store.fetch(np.array([[4, 0, -1], [2, 1, 3]]))
    store.close()
    assert [[json.loads(line) for line in row] for row in fetched] == [[expected[4], expected[0]],
                                                                      [expected[2], expected[1], expected[3]]]
    assert list(iter_passages(path)) == [r["contents"] for r in expected]


def test_bad_corpus_lines_name_the_line(tmp_path):
    """Guards against a broken corpus line failing deep inside the encoder with no hint of where."""
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "contents": "x"}\n{"id": 7, "contents": "y"}\n')
    with pytest.raises(CorpusError, match=r"c.jsonl:2: 'id' must be a string"):
        list(iter_passages(path))
    with pytest.raises(CorpusError, match="not valid JSON"):
        parse_passage(b"{oops", "here")
    with pytest.raises(CorpusError, match="'contents' must be a string"):
        parse_passage(b'{"id": "a"}', "here")


def test_manifest_records_the_build_and_corpus_checks_name_the_corpus(bm25_index, corpus_path, tmp_path):
    """Guards against serving an index over an edited corpus (ids would point at the wrong passages)."""
    manifest = Manifest.load(bm25_index)
    scan = scan_corpus(corpus_path)
    assert (manifest.retriever, manifest.count, manifest.corpus_sha256) == ("bm25", scan.count, scan.sha256)
    check_corpus(manifest, bm25_index, scan)
    check_corpus_size(manifest, bm25_index, corpus_path)

    edited = tmp_path / "edited.jsonl"  # same size, one character changed: only the checksum sees it
    edited.write_text(corpus_path.read_text().replace("Kelbrook", "Kelbroox", 1))
    check_corpus_size(manifest, bm25_index, edited)
    with pytest.raises(ManifestError, match="corpus mismatch.*edited.jsonl.*rebuild"):
        check_corpus(manifest, bm25_index, scan_corpus(edited))
    longer = tmp_path / "longer.jsonl"
    longer.write_text(corpus_path.read_text() + '{"id": "x", "contents": "extra"}\n')
    with pytest.raises(ManifestError, match="corpus mismatch.*bytes"):
        check_corpus_size(manifest, bm25_index, longer)


def test_missing_or_foreign_manifest_is_refused(tmp_path, bm25_index):
    """Guards against serving a half-built index (the manifest is written last) or another tool's files."""
    with pytest.raises(ManifestError, match="no manifest.json"):
        Manifest.load(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"retriever": "bm25", "format_version": 99}))
    with pytest.raises(ManifestError, match="not a manifest of a version this server reads"):
        Manifest.load(tmp_path)


def test_failed_rebuild_leaves_the_old_index(bm25_index, tmp_path):
    """Guards against a failed rebuild leaving the old manifest beside new, partial index files, or deleting the
    old index's manifest (it could no longer be served): the build is staged beside --out (staging.py)."""
    out = tmp_path / "idx"
    shutil.copytree(bm25_index, out)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(CorpusError, match="no passages"):
        build_index(empty, out, retriever="bm25", progress=False)
    assert (out / MANIFEST_NAME).exists()  # refused before touching the old index
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "contents": "x"}\nnot json\n')
    with pytest.raises(CorpusError):
        build_index(bad, out, retriever="bm25", progress=False)
    assert (out / MANIFEST_NAME).read_bytes() == (bm25_index / MANIFEST_NAME).read_bytes()


def test_encoder_check_compares_behaviour_not_names(flat_index, tmp_path):
    """Guards against accepting a different encoder (wrong vectors, silently bad search) or refusing the same
    model copied to another path."""
    manifest = Manifest.load(flat_index)
    assert manifest.model == DEFAULT_MODEL and manifest.dim == 384 and len(manifest.probe) == 384
    copy = tmp_path / "minilm_copy"
    shutil.copytree(DEFAULT_MODEL, copy)
    check_encoder(manifest, flat_index, str(copy), Encoder(str(copy)).fingerprint())
    e5_style = Encoder(str(copy), query_prefix="query: ", passage_prefix="passage: ")
    with pytest.raises(ManifestError, match="encoder mismatch.*cosine"):
        check_encoder(manifest, flat_index, "prefixed", e5_style.fingerprint())
    with pytest.raises(ManifestError, match="encoder mismatch.*dim 8"):
        check_encoder(manifest, flat_index, "small", np.ones(8, dtype=np.float32))


def test_corpus_truncated_after_load_is_an_error_not_garbage(tmp_path):
    """Guards against a corpus rewritten in place under a running server returning cut-off JSON (or, with a
    memory map, killing the server with SIGBUS)."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "contents": f"text {i}"}) + "\n" for i in range(4)))
    store = CorpusStore(scan_corpus(path))
    with path.open("r+b") as f:
        f.truncate(f.seek(0, 2) - 10)
    with pytest.raises(CorpusError, match="truncated"):
        store.fetch(np.array([[3]]))
    store.close()


CORPUS_RSS_SCRIPT = """
import json, sys, numpy as np
from retrieval_server.index.corpus import CorpusStore, scan_corpus
def anon_kb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1])
before = anon_kb()
scan = scan_corpus(sys.argv[1])
store = CorpusStore(scan)
rows = np.array([[scan.count - 1, 0, scan.count // 2]])
print(anon_kb() - before, json.dumps([json.loads(line)["id"] for line in store.fetch(rows)[0]]))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_corpus_is_read_by_offset_not_loaded(tmp_path):
    """Guards against the server holding the corpus in RAM (wiki-18's 21M passages are ~14 GB of text): after
    the scan it keeps 16 bytes of offsets per passage and reads the lines it returns from the file."""
    n = 40_000
    path = tmp_path / "big.jsonl"
    filler = "lorem ipsum dolor sit amet " * 36  # ~1 kB per line
    path.write_text("".join(json.dumps({"id": f"p{i}", "contents": f'"T{i}"\n{filler}{i}'}) + "\n" for i in range(n)))
    done = subprocess.run([sys.executable, "-c", CORPUS_RSS_SCRIPT, str(path)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    growth_kb, ids = done.stdout.split(maxsplit=1)
    assert json.loads(ids) == [f"p{n - 1}", "p0", f"p{n // 2}"]
    corpus_kb = path.stat().st_size // 1024
    assert int(growth_kb) < corpus_kb / 8, (growth_kb, corpus_kb)  # offsets: 16 B per ~1 kB line
