"""The demo's policy does not hang on the machine: same seed, same file, whoever builds it, with any thread count.

Guards against the demo that gave 0.200 -> 0.555 (two-hop 0.41) one day and 0.340 -> 0.375 (two-hop 0.00) the
next with the same code: the warm start's last bits followed the processor's kernels and the thread count, and
PPO's outcome followed them. Here the warm start runs (a few steps, the real demo knowledge base and BM25
service) once through `make demo`'s path (the launcher, DEMO_PREPARE_ONLY=1, one thread) and once through
benchmarks/ablations.py's (two threads), each a fresh process: the model files must be the same bytes. Then
two PPO steps of the demo's trainer on that policy, with one thread and with two, must log the same figures.
Also guards against a policy warm-started with other DEMO_WARM_START_ARGS being reused as this one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep.tiny_policy import demo_numerics_env
from retrieval_server.launcher import ServerProcess, free_port
from verl.utils.tracking import read_metrics

pytestmark = pytest.mark.slow  # builds the demo knowledge base, a BM25 service and two warm starts

ROOT = Path(__file__).resolve().parents[2]
TREE = ("train_ppo.sh", "train_grpo.sh", "retrieval_launch.sh", "scripts", "configs", "data_prep", "benchmarks",
        "verl")
FEW_STEPS = "--steps 6 --copy-steps 6"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the launchers, configs, data_prep and benchmarks (the demo writes data/demo into it)."""
    root = tmp_path_factory.mktemp("demo_numerics") / "tree"
    root.mkdir()
    for name in TREE:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, root / name,
                                                                    **({"ignore": shutil.ignore_patterns(
                                                                        "__pycache__")} if (ROOT / name).is_dir()
                                                                       else {}))
    return root


def test_launcher_and_ablations_build_the_same_policy_and_its_steps_do_not_depend_on_the_thread_count(
        tree, tmp_path, monkeypatch):
    """One test, as one policy serves both checks (a second module-level test started another service for it).
    First the warm start: the launcher's and the ablations' policy are the same bytes. Then the demo's PPO, under
    the launcher's pinned numerics, on that policy: two steps with one thread and with two give the same losses,
    rewards and search counts to the last bit (timings aside)."""
    env = {**os.environ, "PYTHON": sys.executable, "DEMO_SEED": "1", "DEMO_PORT": str(free_port()),
           "DEMO_PREPARE_ONLY": "1", "DEMO_WARM_START_ARGS": FEW_STEPS, "PYTHONPATH": str(tree)}
    for key in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        env.pop(key, None)  # the launcher must pin them itself
    # A policy of this seed warm-started earlier without DEMO_WARM_START_ARGS (none recorded) in a demo directory of
    # the current code: it must be warm-started again with FEW_STEPS, not reused.
    by_launcher = tree / "data" / "demo" / "tiny_policy_seed1"
    by_launcher.mkdir(parents=True)
    (by_launcher / "config.json").write_text("{}")
    (tree / "data" / "demo" / ".source_hash").write_text(subprocess.run(
        ["bash", "-c", "source scripts/launch_common.sh && demo_source_hash"], cwd=tree, capture_output=True,
        text=True, check=True).stdout)
    launched = subprocess.run(["bash", "train_ppo.sh"], cwd=tree, env={**env, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=900)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    assert "was warm-started with other arguments ('', now '--steps 6 --copy-steps 6')" in launched.stdout
    assert (by_launcher / "model.safetensors").is_file()
    assert (by_launcher / ".warm_start_args").read_text().split() == FEW_STEPS.split()

    # The ablation path: benchmarks/ablations.py's own warm_start() (its ROOT is the tree), in a fresh process
    # with two threads and without the pinned variables in its environment.
    spec = importlib.util.spec_from_file_location("tree_ablations", tree / "benchmarks" / "ablations.py")
    ablations = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablations)
    assert ablations.ROOT == tree
    def ablations_env(patch: pytest.MonkeyPatch) -> None:
        for key, value in {"OMP_NUM_THREADS": "2", "DEMO_WARM_START_ARGS": FEW_STEPS, "PYTHONPATH": str(tree)}.items():
            patch.setenv(key, value)
        for key in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
            patch.delenv(key, raising=False)

    demo = tree / "data" / "demo"
    with monkeypatch.context() as patch:
        ablations_env(patch)
        service = ServerProcess(index_dir=demo / "index_bm25", corpus=demo / "corpus.jsonl")  # as the ablations'
    with service:  # the service of the warm start and of the PPO steps below
        service.wait_ready()
        with monkeypatch.context() as patch:
            ablations_env(patch)
            by_ablations = ablations.warm_start(1, tmp_path / "ablations", service.url)

        for name in ("model.safetensors", "tokenizer.json"):
            assert digest(by_launcher / name) == digest(by_ablations / name), name
        figures = [json.loads((d / "warm_start.json").read_text())["figures"] for d in (by_launcher, by_ablations)]
        assert figures[0]["final_loss"] == figures[1]["final_loss"]

        # The demo's PPO on the launcher's policy, with one thread and with two, each a fresh process.
        records = []
        for threads in ("1", "2"):
            out = tmp_path / f"threads{threads}"
            env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(tree), **demo_numerics_env()}
            done = subprocess.run(
                [sys.executable, "-m", "verl.trainer.main_ppo", "--config", "configs/demo.yaml",
                 f"actor_rollout_ref.model.path={by_launcher}", f"retriever.url={service.url}", "trainer.seed=2",
                 "data.seed=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "critic.ppo_mini_batch_size=4", "trainer.total_training_steps=2", "trainer.test_freq=-1",
                 "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
                 f"trainer.default_local_dir={out}"],
                cwd=tree, env=env, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            records.append([{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))}
                            for r in read_metrics(out / "metrics.jsonl")])
    assert len(records[0]) == 2 and "actor/pg_loss" in records[0][-1]
    assert json.dumps(records[0]) == json.dumps(records[1])  # NaN (an unscored metric) compares equal as text
