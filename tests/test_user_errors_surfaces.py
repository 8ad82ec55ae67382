"""The newer surfaces fail as cleanly as the old ones: one test per class of bad input found by the second bad-input
run (``benchmarks/bad_inputs.py`` runs the whole set and counts the outcomes).

Classes: endpoint sets in ``retriever.url`` that cannot serve a run (through ``main_ppo``), a ``RAY_ADDRESS`` where
no cluster answers (every command that joins one), non-finite or absurd numeric settings and reward-term shapes,
``search_r1.infer`` questions, a run directory moved elsewhere and resumed, and the service's API docs. A failed
build or import over a good index is in tests/retrieval_server/test_staging.py; an update that would make a weight
non-finite in tests/verl/workers/test_train_utils.py. Everything is real: servers on loopback, the tiny policy; the
trainer's refused launches run its ``main`` in this process (``tests/entry_points.py``).
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess, free_port
from tests.entry_points import in_process, main_ppo_in_process
from tests.test_user_errors import assert_refused, run, tiny_workspace, train_args
from tests.verl.trainer.trainer_test_utils import copy_run, trained_run_args
from verl.config import DEMO_CONFIG, load_config

pytestmark = pytest.mark.slow  # starts trainers and services

GUILDS = [(f"p{i}", f"Guild {i}", f"The guild number {i} of Vuzaholm was founded by name {i}.") for i in range(12)]
SERVE = ["--threads", "1"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    return tiny_workspace(tmp_path_factory.mktemp("surfaces"))


def write_corpus(path: Path, passages: list[tuple[str, str, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n" for i, t, x in passages))
    return path


@pytest.fixture(scope="module")
def endpoints(flat_server, shard_sets, tmp_path_factory):
    """URLs: ``flat`` (a whole index), ``a0``/``a1`` (the two shards of one build of the same corpus), ``c1`` (a shard
    of another corpus's build), ``foreign`` (an HTTP server whose /health is a file, not a retrieval service). The
    retrieval servers are the session's (tests/retrieval_servers.py), shared with tests/retrieval_server/
    test_shards.py."""
    root = tmp_path_factory.mktemp("endpoints")
    urls = {"flat": flat_server.url, "a0": shard_sets["two", 0], "a1": shard_sets["two", 1],
            "c1": shard_sets["other", 1]}
    (root / "www").mkdir()
    (root / "www" / "health").write_text("<html>hello</html>\n")
    port = free_port()
    foreign = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                               cwd=root / "www", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        urls["foreign"] = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(urls["foreign"] + "/health")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield urls
    finally:
        foreign.kill()


@pytest.mark.parametrize("case, urls, message", [
    ("a shard alone", ["a0"], "serves only shard 0 of 2"),
    ("a missing shard", ["a0", "a0"], "missing shard 1 of 2"),
    ("shards of two corpora", ["a0", "c1"], "different corpus"),
    ("a whole index and a shard", ["flat", "a1"], "different shard sets"),
    ("an endpoint that is not ours", ["flat", "foreign"], "is not a retrieval service"),
])
def test_endpoint_sets_that_cannot_serve_are_refused_by_the_trainer(ws, endpoints, tmp_path, case, urls, message):
    """Guards against every mismatched endpoint set ending main_ppo in an uncaught RetrievalError traceback and exit
    1 (evaluate and infer said exit 2 with the same message)."""
    url = ",".join(endpoints[name] for name in urls)
    done = main_ppo_in_process(*train_args(ws, tmp_path / "run", "do_search=true", f"retriever.url={url}"))
    assert_refused(done, "config key retriever.url is invalid", message, endpoints[urls[-1]])


def test_endpoint_lists_are_parsed_whole(ws, endpoints, tmp_path):
    """Guards against endpoints joined with ';' reaching httpx (InvalidURL traceback), and against several
    endpoints each ending in /retrieve being refused with a 404 where one such URL is accepted."""
    a0, a1 = endpoints["a0"], endpoints["a1"]
    assert_refused(main_ppo_in_process(*train_args(ws, tmp_path / "run", f"retriever.url={a0};{a1}")),
                   f"'{a0};{a1}': separate endpoints with commas")
    cfg = load_config([f"retriever.url={a0}/retrieve,{a1}/retrieve/"], [DEMO_CONFIG])
    assert cfg.retriever.url == f"{a0},{a1}"


def test_a_dead_ray_address_is_an_error_within_the_timeout(ws, tmp_path):
    """Guards against the trainer (trainer.backend=ray), evaluate (ray://NAME) and ray_service status waiting for
    ever on a RAY_ADDRESS where no cluster answers (Ray prints "Failed to connect to GCS" every 5 s)."""
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = {"RAY_ADDRESS": address}
    commands = [
        ("verl.trainer.main_ppo", *train_args(ws, tmp_path / "run", "trainer.backend=ray", "trainer.ray_timeout_s=3")),
        ("search_r1.evaluate", "--model", ws / "model", "--data", ws / "test.parquet", "--out", tmp_path / "eval",
         "--retriever-url", "ray://wiki", "--ray-timeout", "3"),
        ("retrieval_server.ray_service", "status", "--name", "wiki", "--ray-timeout", "3"),
    ]
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:  # at once: each mostly waits
        for command, done in zip(commands, pool.map(lambda c: run(*c, timeout=120, env=env), commands), strict=True):
            assert_refused(done, f"{address}", "within 3s", "ray start --head")
            assert time.monotonic() - start < 90, command[0]


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.optim.lr=inf", "actor_rollout_ref.actor.optim.lr=inf is invalid: allowed a finite"),
    ("critic.optim.lr=nan", "critic.optim.lr=nan is invalid: allowed a finite"),
    ("actor_rollout_ref.rollout.temperature=inf", "actor_rollout_ref.rollout.temperature=inf is invalid"),
    ("actor_rollout_ref.actor.optim.lr=3", "actor_rollout_ref.actor.optim.lr=3.0 is invalid: allowed a learning rate"),
    ("actor_rollout_ref.actor.clip_ratio=1.5", "actor_rollout_ref.actor.clip_ratio=1.5 is invalid: allowed PPO's"),
    ("reward.terms=[em,f1]", "reward.terms=['em', 'f1'] is invalid: allowed a mapping"),
])
def test_non_finite_or_absurd_settings_are_refused_at_start(ws, tmp_path, override, message):
    """Guards against lr=inf passing validation and training a model whose every tensor is NaN/inf (exit 0), and
    against reward.terms given as a list ending in an OmegaConf merge traceback."""
    assert_refused(main_ppo_in_process(*train_args(ws, tmp_path / "run", override)), message)


def test_hydra_style_mapping_is_read_as_hydra_means_it():
    """Guards against reward.terms={em:1.0} (no space after the colon) failing with "field 'reward.terms.em:1.0' is
    not Optional"."""
    cfg = load_config(["reward.terms={em:1.0,f1:0.5}"], [DEMO_CONFIG])
    assert cfg.reward.terms == {"em": 1.0, "f1": 0.5}


def test_infer_refuses_empty_and_overlong_questions(ws):
    """Guards against an empty, blank or 100 kB --question ending in a ValueError traceback (infer's main in this
    process: tests/entry_points.py)."""
    base = ("search_r1.infer", "--model", ws / "model", "--retriever-url", f"http://127.0.0.1:{free_port()}")
    for question in ("", "  \n "):
        assert_refused(in_process(*base, "--question", question), "--question is empty")
    assert_refused(in_process(*base, "--question", "why " * 25_000),
                   "--question of 100,000 characters makes a prompt of", "data.max_prompt_length=")


def test_a_moved_run_directory_resumes(workspace, trained_run, tmp_path):
    """Guards against a copied or moved run directory being refused on resume because its config.yaml records the
    old trainer.default_local_dir. The run is a copy of the shared trained run as it stood after step 1."""
    first = copy_run(trained_run, tmp_path / "first", 1)
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(first, moved)
    done = main_ppo_in_process(*trained_run_args(workspace, moved, 2))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing global_step_1" in done.stdout
    steps = [json.loads(line)["step"] for line in (moved / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]  # 0: the validation before step 1
    assert (moved / "global_step_2").is_dir()


def test_api_docs_are_off_unless_asked_for(tmp_path):
    """Guards against /docs, /redoc and /openapi.json being open on the service by default."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", GUILDS)
    build_index(corpus, tmp_path / "bm25", retriever="bm25", progress=False)
    with ServerProcess(tmp_path / "bm25", corpus, SERVE) as plain, \
            ServerProcess(tmp_path / "bm25", corpus, [*SERVE, "--docs"]) as documented:
        plain.wait_ready()
        documented.wait_ready()
        for page in ("/docs", "/redoc", "/openapi.json"):
            assert httpx.get(plain.url + page).status_code == 404, page
            assert httpx.get(documented.url + page).status_code == 200, page
