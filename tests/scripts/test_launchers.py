"""train_ppo.sh / train_grpo.sh: the launcher's exit status is the trainer's, and a service it started is stopped.

Guards against a successful run that exits non-zero (the stopped service's status leaking out of the launcher's
EXIT trap: `make demo && make grpo` never reached GRPO), a failed run that exits 0, and a retrieval service left
running after the launcher ends. Real launcher, real retrieval service (started by the launcher on a free
loopback port over a small corpus), real trainer with a tiny model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import save_tiny_model
from retrieval_server.launcher import free_port
from search_r1.prompts import make_prompt

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("launch")
    passages = [f'"Guild {i}"\nThe guild number {i} of Vuzaholm was founded by Arlen Tosk {i}.' for i in range(8)]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": p}) + "\n"
                                               for i, p in enumerate(passages)))
    questions = [f"Who founded the guild number {i} of Vuzaholm" for i in range(4)]
    save_tiny_model(root / "model", [make_prompt(q) for q in questions] * 4, vocab_size=600)
    rows_to_parquet([make_row("toy", q, [f"Arlen Tosk {i}"], "train", i) for i, q in enumerate(questions)],
                    root / "train.parquet")
    return root


def launch(script: str, ws: Path, tmp_path: Path, port: int, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CORPUS": str(ws / "corpus.jsonl"),
           "INDEX_DIR": str(tmp_path / "index"), "RETRIEVAL_LOG": str(tmp_path / "retrieval.log")}
    args = [f"data.train_files={ws / 'train.parquet'}", f"data.val_files={ws / 'train.parquet'}",
            f"actor_rollout_ref.model.path={ws / 'model'}", f"retriever.url=http://127.0.0.1:{port}",
            "data.train_batch_size=4", "data.max_response_length=24", "data.max_obs_length=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size=2",
            "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size=2", "trainer.total_training_steps=1",
            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false",
            "trainer.logger=[jsonl]", f"trainer.default_local_dir={tmp_path / 'out'}", *extra]
    return subprocess.run(["bash", str(ROOT / script), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def service_answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("script", ["train_ppo.sh", "train_grpo.sh"])
def test_successful_run_exits_zero_and_stops_its_service(workspace, tmp_path, script):
    port = free_port()
    extra = ["actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8"] \
        if script == "train_grpo.sh" else []
    done = launch(script, workspace, tmp_path, port, *extra)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "starting retrieval_launch.sh" in done.stdout  # the launcher, not a stray service, served this run
    assert (tmp_path / "out" / "metrics.jsonl").exists()
    assert not service_answers(port)


def test_failed_run_exits_non_zero_and_stops_its_service(workspace, tmp_path):
    port = free_port()
    done = launch("train_ppo.sh", workspace, tmp_path, port, "actor_rollout_ref.model.path=/nonexistent/model")
    assert done.returncode != 0
    assert "starting retrieval_launch.sh" in done.stdout
    assert not service_answers(port)
