"""A run records what it searched (search_r1/search/identity.py): the service's /health identity in the run
directory's retrieval.json, checked again on resume; the demo's corpus served for other data is a warning.

Guards against issue 37: the run directory recorded only retriever.url, and a command without one trained against
another user's demo service on port 8000 and passed the health check.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from data_prep import demo_kb
from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess
from search_r1.search.client import RetrievalClient
from search_r1.search.identity import DEMO_CORPUS_SHA256, RECORD_FILE, record_retrieval, warn_if_demo_corpus
from tests.entry_points import main_ppo_in_process
from tests.search_workspace import build_search_workspace
from verl.utils.run_dir import RunDirError

ROOT = Path(__file__).resolve().parents[3]


def test_the_demo_corpus_hash_is_the_generators(tmp_path):
    """DEMO_CORPUS_SHA256 must follow data_prep.demo_kb, or the demo-corpus warning would never fire."""
    demo_kb.main(["--out", str(tmp_path)])
    assert hashlib.sha256((tmp_path / "corpus.jsonl").read_bytes()).hexdigest() == DEMO_CORPUS_SHA256


def test_demo_corpus_for_other_data_warns(caplog):
    demo = {"corpus_sha256": DEMO_CORPUS_SHA256, "passages": 120}
    with caplog.at_level(logging.WARNING, logger="search_r1.search.identity"):
        assert warn_if_demo_corpus(demo, "http://127.0.0.1:8000", {"nq"})
        assert not warn_if_demo_corpus(demo, "http://127.0.0.1:8000", {"demo_single", "demo_multi"})
        assert not warn_if_demo_corpus({"corpus_sha256": "f" * 64}, "http://127.0.0.1:8000", {"nq"})
    (message,) = [r.getMessage() for r in caplog.records]
    assert "serves the embedded demo's corpus" in message and "nq" in message


def test_record_is_written_and_a_changed_corpus_refused_on_resume(tmp_path):
    health = {"corpus_sha256": "a" * 64, "passages": 8, "retriever": "dense", "index": "flat", "model": "minilm",
              "probe_sha256": "p", "recall": None, "corpus_path": "/data/a.jsonl", "index_path": "/indexes/a",
              "index_kind": "flat", "cache_size": 4}
    record_retrieval(tmp_path, "http://127.0.0.1:1", health, resuming=False)
    saved = json.loads((tmp_path / RECORD_FILE).read_text())
    assert saved == {"url": "http://127.0.0.1:1", **{k: v for k, v in health.items() if k != "cache_size"}}
    record_retrieval(tmp_path, "http://127.0.0.1:2", health, resuming=True)  # same corpus, another port: fine
    with pytest.raises(RunDirError, match=r"corpus sha256 aaaaaaaaaaaa.. \(8 passages\).*serves corpus sha256 "
                                          r"bbbbbbbbbbbb.. \(9 passages\)"):
        record_retrieval(tmp_path, "http://127.0.0.1:3", {**health, "corpus_sha256": "b" * 64, "passages": 9}, True)


def test_the_record_names_the_services_corpus_file_index_directory_and_kind(tmp_path):
    """Guards against issue 57's item 6: retrieval.json recorded the corpus's sha256 and size but not which corpus
    file or index directory the service loaded, so a user with several corpora matched hashes by hand. A real
    service over a BM25 index, started from another directory with relative paths: the record holds both paths,
    absolute, and the index's kind."""
    (tmp_path / "ws").mkdir()
    ws = build_search_workspace(tmp_path / "ws")
    with ServerProcess("index", "corpus.jsonl", cwd=ws) as server:
        server.wait_ready()
        with RetrievalClient(server.url, topk=3) as client:
            record_retrieval(tmp_path / "run", server.url, client.check_health(), resuming=False)
    saved = json.loads((tmp_path / "run" / RECORD_FILE).read_text())
    assert saved["corpus_path"] == str((ws / "corpus.jsonl").resolve())
    assert saved["index_path"] == str((ws / "index").resolve())
    assert saved["index_kind"] == "bm25"


@pytest.mark.slow
def test_resume_against_a_service_over_another_corpus_is_refused(tmp_path):
    """Train one step against a service, then continue the run against a service over another corpus: exit 2 naming
    both corpora, before any step; the run's retrieval.json still names the first (the trainer's main in this
    process, tests/entry_points.py)."""
    (tmp_path / "ws").mkdir()
    ws = build_search_workspace(tmp_path / "ws")
    other = tmp_path / "other.jsonl"
    other.write_text((ws / "corpus.jsonl").read_text() + json.dumps({"id": "x", "contents": '"X"\nextra'}) + "\n")
    build_index(other, tmp_path / "other_index", retriever="bm25")
    out = tmp_path / "run"

    def args(url: str, steps: int) -> list[str]:
        return [f"data.train_files={ws / 'data' / 'train.parquet'}", f"data.val_files={ws / 'data' / 'test.parquet'}",
                f"actor_rollout_ref.model.path={ws / 'model'}", "actor_rollout_ref.rollout.name=hf",
                f"retriever.url={url}", "data.train_batch_size=4", "data.max_trajectory_length=24",
                "data.max_obs_length=64", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_mini_batch_size=4",
                "critic.ppo_micro_batch_size_per_gpu=2", f"trainer.total_training_steps={steps}",
                "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.val_before_train=false",
                "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}", "trainer.device=cpu"]

    with ServerProcess(ws / "index", ws / "corpus.jsonl") as first:
        first.wait_ready()
        done = main_ppo_in_process(*args(first.url, 1))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    recorded = json.loads((out / RECORD_FILE).read_text())
    assert recorded["corpus_sha256"] == hashlib.sha256((ws / "corpus.jsonl").read_bytes()).hexdigest()
    assert recorded["retriever"] == "bm25" and recorded["passages"] == 8
    with ServerProcess(tmp_path / "other_index", other) as second:
        second.wait_ready()
        done = main_ppo_in_process(*args(second.url, 2))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    assert "(8 passages)" in done.stderr and "(9 passages)" in done.stderr
    assert not (out / "global_step_2").exists() and json.loads((out / RECORD_FILE).read_text()) == recorded
