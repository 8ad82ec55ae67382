"""train_ppo.sh / train_grpo.sh: the demo is prepared only when nothing points elsewhere; a user's run never gets
a substitute; exit statuses are the trainer's; the console of a run is short and clean.

Guards against (1) the launcher that, with a user's data and nothing answering at retriever.url, started the demo's
BM25 service over the demo corpus, trained the user's questions against it and exited 0; (2) a successful demo run
that exits non-zero (the stopped service's status leaking out of the EXIT trap: `make demo && make grpo` never
reached GRPO), a failed one that exits 0, and a demo service left running; (3) a console of hundreds of lines (a
config dump, per-request HTTP lines, load reports, progress bars in a log file). Real launchers, real retrieval
service, real trainer with a tiny model built here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from retrieval_server.launcher import ServerProcess, free_port
from tests.search_workspace import build_search_workspace

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["data.train_batch_size=4", "data.max_trajectory_length=24", "data.max_obs_length=32",
         "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2", "trainer.save_freq=-1",
         "trainer.test_freq=-1", "trainer.val_before_train=false"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """"The user's" parts: a corpus, its BM25 index, questions as parquet and a tiny model."""
    return build_search_workspace(tmp_path_factory.mktemp("launch"))


def user_args(ws: Path, out: Path, port: int, *extra: str) -> list[str]:
    return [f"data.train_files={ws / 'data' / 'train.parquet'}", f"data.val_files={ws / 'data' / 'test.parquet'}",
            f"actor_rollout_ref.model.path={ws / 'model'}", f"retriever.url=http://127.0.0.1:{port}", *SMALL,
            "trainer.total_training_steps=1", "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}", *extra]


def launch(root: Path, script: str, args: list[str], **env: str) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.Popen(["bash", str(root / script), *args], cwd=root, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def service_answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_own_data_and_a_closed_port_exit_2_without_starting_a_service(workspace, tmp_path):
    """Guards against the silent fallback: the user's data and model, nothing at retriever.url -> exit 2 naming the
    URL and how to start a service; no service started, nothing trained, no run directory."""
    port = free_port()
    code, out = finish(launch(ROOT, "train_ppo.sh", user_args(workspace, tmp_path / "out", port),
                              RETRIEVAL_LOG=str(tmp_path / "retrieval.log")))
    assert code == 2, out
    assert f"http://127.0.0.1:{port}/health" in out and "retrieval_launch.sh" in out and "--wait-for-retriever" in out
    assert "starting the demo's retrieval service" not in out and not (tmp_path / "retrieval.log").exists()
    assert not service_answers(port) and not (tmp_path / "out").exists()
    # Search-R1 writes the endpoint (/retrieve); the same refusal, and the URL checked is the service's base.
    args = user_args(workspace, tmp_path / "out", port)
    args[3] = f'retriever.url=http://127.0.0.1:{port}/retrieve'
    code, out = finish(launch(ROOT, "train_grpo.sh", args + ["actor_rollout_ref.rollout.n=2"]))
    assert code == 2 and f"http://127.0.0.1:{port}/health" in out, out


def test_wait_for_retriever_trains_once_the_service_is_up_with_a_short_clean_console(workspace, tmp_path):
    """--wait-for-retriever waits for a service that comes up late, then trains on it (exit 0). The console of this
    2-step run, piped to a file, is a short summary plus one line per step: no traceback, under 60 lines."""
    port = free_port()
    args = user_args(workspace, tmp_path / "out", port, "trainer.total_training_steps=2",
                     "trainer.logger=[console,jsonl]")
    proc = launch(ROOT, "train_ppo.sh", ["--wait-for-retriever", "300", *args])
    time.sleep(3)
    assert proc.poll() is None  # still waiting
    with ServerProcess(workspace / "index", workspace / "corpus.jsonl", port=port) as server:
        server.wait_ready()
        code, out = finish(proc)
    assert code == 0, out
    assert "waiting up to 300 s" in out
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["agent/searches_per_traj"] >= 0 for r in records)
    lines = out.splitlines()
    assert "Traceback" not in out and len(lines) < 60, out
    assert sum(line.startswith("step ") for line in lines) == 2, out  # one line per step
    assert any(line.startswith("model ") for line in lines) and any("actor update(s)" in line for line in lines)
    assert (tmp_path / "out" / "config.yaml").exists()  # the full config is in the run directory, not the console


# ---------------------------------------------------------------------------------------------- demo mode
DEMO_CODE = ("train_ppo.sh", "train_grpo.sh", "retrieval_launch.sh", "scripts", "configs", "data_prep", "verl")


@pytest.fixture
def demo_tree(workspace, tmp_path) -> Path:
    """A copy of the launchers with a ready demo directory (the workspace's corpus, questions and model as
    data/demo, stamped with the demo code's hash), so demo mode runs without the minutes of warm start."""
    root = tmp_path / "tree"
    root.mkdir()
    for name in DEMO_CODE:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, root / name)
    demo = root / "data" / "demo"
    demo.mkdir(parents=True)
    shutil.copy(workspace / "corpus.jsonl", demo / "corpus.jsonl")
    shutil.copy(workspace / "data" / "train.parquet", demo / "train.parquet")
    shutil.copy(workspace / "data" / "test.parquet", demo / "test.parquet")
    shutil.copytree(workspace / "model", demo / "tiny_policy")
    stamp = subprocess.run(["bash", "-c", "source scripts/launch_common.sh && demo_source_hash"], cwd=root,
                           capture_output=True, text=True, check=True).stdout
    (demo / ".source_hash").write_text(stamp)
    return root


@pytest.mark.parametrize("script", ["train_ppo.sh", "train_grpo.sh"])
def test_demo_run_exits_zero_and_stops_its_service(demo_tree, script):
    """No argument points elsewhere: the launcher starts the demo's service over data/demo (building its index),
    trains, exits 0 and stops the service."""
    extra = ["actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8"] \
        if script == "train_grpo.sh" else []
    port = free_port()  # DEMO_PORT: the demo's service listens there (a retriever.url would leave demo mode)
    # The demo's own save_freq (one save, after the last step), not SMALL's -1: a second run must find it complete.
    args = [*SMALL, "trainer.total_training_steps=1", "trainer.logger=[jsonl]", "trainer.save_freq=1000", *extra]
    code, out = finish(launch(demo_tree, script, args, DEMO_PORT=str(port)))
    assert code == 0, out
    assert "starting the demo's retrieval service" in out
    assert (demo_tree / "outputs" / "search_r1" / script.replace("train_", "demo_").replace(".sh", "")
            / "metrics.jsonl").exists()
    assert not service_answers(port)
    # `make demo` twice: the second run trains nothing, says so and exits 0 (it used to refuse the directory).
    code, out = finish(launch(demo_tree, script, args, DEMO_PORT=str(port)))
    assert code == 0 and "run already complete" in out, out
    assert not service_answers(port)


def test_failed_demo_run_exits_non_zero_and_stops_its_service(demo_tree):
    port = free_port()
    code, out = finish(launch(demo_tree, "train_ppo.sh", [*SMALL, "trainer.total_training_steps=1",
                                                          "actor_rollout_ref.actor.ppo_mini_batch_size=3"],
                              DEMO_PORT=str(port)))
    assert code == 2 and "ppo_mini_batch_size" in out, out
    assert "starting the demo's retrieval service" in out
    assert not service_answers(port)
