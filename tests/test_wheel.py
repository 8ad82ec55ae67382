"""The built wheel works outside the repository: every module and the default config ship, and the console
commands run.

Guards against `pip install .` (non-editable, as on a cluster image) leaving out a package without
``__init__.py`` (verl/utils once) or ``configs/ppo_trainer.yaml``, so that the installed trainer could not import
``verl.utils.checkpoint`` or find its defaults while every test in the checkout passed. The wheel is installed
into a fresh virtual environment in a temporary directory; its dependencies come from the project's venv through
a path entry (that directory's own .pth files, the project's editable install among them, are not processed),
and every command runs from outside the checkout.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import save_tiny_model
from retrieval_server.launcher import ServerProcess, free_port
from search_r1.prompts import make_prompt

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

ROOT = Path(__file__).resolve().parents[1]


def outside_env() -> dict[str, str]:
    """This environment without what would point Python back at the checkout or the project's venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=outside_env(), capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv outside the checkout with the wheel installed; returns its bin directory."""
    root = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w",
         str(root / "dist")], cwd=root)
    (wheel,) = (root / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "verl/*.py", "search_r1/*.py", "retrieval_server/*.py",
                              "data_prep/*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert [f for f in tracked if f not in names] == []
    assert {"verl/configs/ppo_trainer.yaml", "verl/configs/demo.yaml", "verl/configs/grpo.yaml"} <= names
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps", "-q",
         str(wheel)], cwd=root)
    (purelib,) = (venv / "lib").glob("python3*/site-packages")
    (purelib / "project_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin"


def test_installed_package_imports_from_the_wheel_with_its_config(installed, tmp_path):
    code = ("import verl, verl.utils.checkpoint, verl.config as c, search_r1, retrieval_server, data_prep; "
            "print(verl.__file__); print(c.DEFAULT_CONFIG); print(c.load_config([]).data.max_obs_length)")
    out = run([str(installed / "python"), "-c", code], cwd=tmp_path).stdout.split()
    venv = installed.parent
    assert out[0].startswith(str(venv)) and out[1].startswith(str(venv)) and out[1].endswith("ppo_trainer.yaml")
    assert out[2] == "500"


def test_console_commands_build_serve_and_train_one_step(installed, tmp_path):
    """search-r1-build-index, search-r1-retrieve (a query answered) and one search-r1-train step, all from the
    wheel's venv, in a directory outside the checkout."""
    names = ["Amber", "Basalt", "Cobalt", "Dune", "Ember", "Fjord", "Garnet", "Heron"]
    passages = [f'"Guild {n}"\nThe {n} guild of Vuzaholm was founded by Arlen Tosk {n}.' for n in names]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": p}) + "\n"
                                                   for i, p in enumerate(passages)))
    questions = [f"Who founded the {n} guild of Vuzaholm" for n in names[:4]]
    save_tiny_model(tmp_path / "model", [make_prompt(q) for q in questions] * 4, vocab_size=600)
    rows = [make_row("toy", q, [f"Arlen Tosk {n}"], "train", i) for i, (q, n) in enumerate(zip(questions, names))]
    rows_to_parquet(rows, tmp_path / "train.parquet")
    run([str(installed / "search-r1-build-index"), "--corpus", "corpus.jsonl", "--out", "index", "--retriever",
         "bm25"], cwd=tmp_path)
    port = free_port()
    command = [str(installed / "search-r1-retrieve"), "--index", "index", "--corpus", "corpus.jsonl", "--port",
               str(port)]
    with ServerProcess(command=command, port=port, cwd=tmp_path, env=outside_env()) as server:
        server.wait_ready()
        url = server.url
        hits = httpx.post(f"{url}/retrieve", json={"queries": ["the Dune guild"], "topk": 1}).json()["result"]
        assert hits[0][0]["id"] == "3"
        done = run([str(installed / "search-r1-train"), "data.train_files=train.parquet",
                    "data.val_files=train.parquet", "actor_rollout_ref.model.path=model", f"retriever.url={url}",
                    "data.train_batch_size=4", "data.max_trajectory_length=24", "data.max_obs_length=64",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
                    "trainer.total_training_steps=1", "trainer.val_before_train=false",
                    "trainer.test_freq=-1", "trainer.logger=[jsonl]", "trainer.default_local_dir=run"], cwd=tmp_path)
    assert "search   " in done.stdout and (tmp_path / "run" / "hf_model" / "config.json").exists()
    assert [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1]
