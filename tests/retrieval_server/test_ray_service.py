"""The retrieval service and the trainer on a multi-node Ray cluster simulated on this machine.

``ray.cluster_utils.Cluster`` starts a head and a second node (separate raylets, one CPU each, and one unit of a
custom ``retrieval`` resource each, so that two servers and two training ranks can only be placed one per node).
Real servers (``python -m retrieval_server.serve`` under Ray actors), real FAISS, the client as the trainer uses it,
a real training step of the tiny model; the reference for search results is the unsharded flat index.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from retrieval_server.search.service import ServeOptions, load_service
from retrieval_server.serve import ray_deploy
from retrieval_server.serve.ray_actors import DeploymentError, DeploymentSpec, index_dirs, shorten_problem
from search_r1.search import RetrievalClient, RetrievalUnavailable
from search_r1.tools import OPEN_SCHEMA, ToolEnv
from tests.entry_points import main_ppo_in_process
from tests.ray_cluster import forget_as_current_ray
from tests.retrieval_server.test_shards import QUERIES
from tests.verl.trainer.trainer_test_utils import ROOT, metrics, overrides
from verl.tools import ToolCallError, ToolSpec, build_tools

pytestmark = pytest.mark.slow  # a Ray cluster, servers, a training run

NAME = "test-wiki"


@pytest.fixture(scope="module")
def sharded_index(shard_builds):
    """The corpus in 2 shards (the session's build, tests/retrieval_servers.py; nothing writes into it)."""
    return shard_builds("two")[0]


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine; this process is a driver of that cluster."""
    if ray.is_initialized():
        ray.shutdown()
    sim = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"retrieval": 1}})
    forget_as_current_ray(sim.address)
    sim.add_node(num_cpus=1, resources={"retrieval": 1})
    sim.wait_for_nodes()
    ray.init(address=sim.address)
    yield sim
    ray.shutdown()
    sim.shutdown()


@pytest.fixture(scope="module")
def deployment(cluster, sharded_index, corpus_path):
    spec = DeploymentSpec(name=NAME, index=str(sharded_index), corpus=str(corpus_path), num_cpus=0,
                          resources={"retrieval": 1}, serve_args=["--threads", "1"], health_interval_s=1.0)
    ray_deploy.deploy(spec, wait_s=300)
    yield spec
    ray_deploy.undeploy(NAME)


@pytest.fixture(scope="module")
def reference(flat_index, corpus_path):
    service = load_service(flat_index, corpus_path, ServeOptions(threads=1))
    yield service
    service.close()


def _want(reference, queries, topk):
    return [[json.loads(doc) for doc, _, _ in hits] for hits in reference.search(queries, topk)]


def test_shards_are_placed_on_both_nodes_and_searched_as_one_index(cluster, deployment, reference):
    """Guards against replicas that ignore their resource request (both on one node), and against ray://NAME
    resolving to a partial or wrong set: the client finds both shards through the cluster and answers what the
    unsharded flat index answers."""
    slots = ray_deploy.deployment_status(NAME)["slots"]
    assert [(s["shard"], s["state"]) for s in slots] == [(0, "up"), (1, "up")]
    assert len({s["node_id"] for s in slots}) == 2
    assert {s["node_id"] for s in slots} == {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    with RetrievalClient(f"ray://{NAME}", topk=3, max_batch=8) as client:
        client.check_health()
        assert client.search(QUERIES) == _want(reference, QUERIES, 3)


def test_a_killed_server_is_restarted_and_no_request_is_lost(deployment, reference):
    """Guards against a dead replica staying dead (no health check or restart) and against the client holding on
    to the old URL: the server of shard 0 is killed while a client keeps searching; every search returns the flat
    index's answer, the deployment starts a new server (restarts == 1, a new URL) and the client follows it."""
    before = ray_deploy.deployment_status(NAME)["slots"][0]
    want = _want(reference, QUERIES[:8], 3)
    results, errors = [], []
    with RetrievalClient(f"ray://{NAME}", topk=3, max_batch=8, outage_timeout_s=240) as client:
        client.check_health()
        stop = threading.Event()

        def searching():
            while not stop.is_set():
                try:
                    results.append(client.search(QUERIES[:8]))
                except Exception as e:  # noqa: BLE001 -- a lost request is what this test looks for
                    errors.append(e)

        thread = threading.Thread(target=searching)
        thread.start()
        time.sleep(0.5)
        os.kill(before["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            after = ray_deploy.deployment_status(NAME)["slots"][0]
            if after["restarts"] == 1 and after["state"] == "up":
                break
            time.sleep(0.5)
        n_before = len(results)
        while len(results) < n_before + 2 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.2)  # searches answered after the restart, through the new URL
        stop.set()
        thread.join(timeout=240)
    assert errors == []
    assert after["restarts"] == 1 and after["state"] == "up" and after["url"] != before["url"]
    assert "server exited with status -9" in after["last_problem"]
    assert len(results) >= n_before + 2 and all(r == want for r in results)
    assert after["url"] in ray_deploy.resolve_endpoints(f"ray://{NAME}")


def test_a_long_server_log_does_not_push_the_cause_out_of_the_status():
    """Guards against the status keeping only the tail of a problem: a first start that exported the encoder to ONNX
    left long log lines, and "server exited with status -9" (the head) was cut off the 500 characters kept."""
    log = " | ".join(f"2026-11-28 09:54:{i:02d} INFO exporting the encoder to ONNX (once per model): /root/.cache/"
                     f"search_r1/onnx/{i:020d}.onnx" for i in range(20))
    problem = f"server exited with status -9 (log /tmp/replica.log: ... {log} | index ready)"
    short = shorten_problem(problem)
    assert len(short) <= 500 and short.startswith("server exited with status -9") and short.endswith("index ready)")
    assert shorten_problem("server exited with status 1") == "server exited with status 1"


def test_open_reads_whole_documents_from_the_deployments_replicas(deployment, corpus_path):
    """Guards against the open tool failing over ray:// (the client posted /doc to "ray://NAME/doc"): the client
    finds the replicas through the cluster and they answer whole documents by id (their DocumentIndex), for rows of
    either shard, in the order asked; an unknown id is None, which the open tool answers with its error message."""
    lines = [json.loads(line) for line in corpus_path.read_text().splitlines() if line.strip()]
    first, last = lines[0], lines[-1]  # rows of shard 0 and of shard 1
    with RetrievalClient(f"ray://{NAME}", topk=3) as client:
        assert client.documents([last["id"], "no-such-id", first["id"]]) == [last, None, first]
        env = ToolEnv(retrieve=None, client=client, do_search=True)
        tool = build_tools([ToolSpec("OpenTool", {}, OPEN_SCHEMA)], env)["open"]
        opened, missing = asyncio.run(tool.call_many([{"id": last["id"]}, {"id": "no-such-id"}]))
    assert opened == last["contents"]
    assert isinstance(missing, ToolCallError) and "no document has the id 'no-such-id'" in str(missing)


def test_bad_deployments_are_refused_with_what_is_wrong(cluster, deployment, sharded_index, corpus_path, tmp_path):
    """Guards against a second deployment silently replacing a running one, a partial shard set being served, and
    an unknown name failing late or vaguely."""
    with pytest.raises(DeploymentError, match="already running"):
        ray_deploy.deploy(DeploymentSpec(name=NAME, index=str(sharded_index), corpus=str(corpus_path)))
    partial = tmp_path / "partial"
    (partial / "shard-1").mkdir(parents=True)
    for name in os.listdir(sharded_index / "shard-1"):
        (partial / "shard-1" / name).symlink_to(sharded_index / "shard-1" / name)
    with pytest.raises(DeploymentError, match="not one complete set"):
        index_dirs(partial)
    with pytest.raises(DeploymentError, match="no manifest.json"):
        index_dirs(tmp_path)
    with RetrievalClient("ray://nobody-here", topk=3) as client:
        with pytest.raises(RetrievalUnavailable, match="no retrieval deployment named 'nobody-here'.*ray_service up"):
            client.check_health()


def test_command_line_up_status_down(cluster, sharded_index, corpus_path):
    """Guards against the user's path (the command line, in its own process joining the cluster by RAY_ADDRESS)
    exiting 0 without a usable deployment, or non-zero after a good one."""
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "PYTHONPATH": str(ROOT)}

    def cli(*args, timeout=300):
        return subprocess.run([sys.executable, "-m", "retrieval_server.ray_service", *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)

    up = cli("up", "--name", "cli-test", "--index", str(sharded_index), "--corpus", str(corpus_path), "--num-cpus",
             "0", "--wait", "240", "--", "--threads", "1", "--topk", "2")
    assert up.returncode == 0, up.stderr[-3000:]
    assert "retriever.url=ray://cli-test" in up.stdout and up.stdout.count("shard ") == 2
    status = cli("status", "--name", "cli-test")
    assert status.returncode == 0 and [s["state"] for s in json.loads(status.stdout)["slots"]] == ["up", "up"]
    again = cli("up", "--name", "cli-test", "--index", str(sharded_index), "--corpus", str(corpus_path))
    assert again.returncode == 2 and "already running" in again.stderr
    assert cli("down", "--name", "cli-test").returncode == 0
    gone = cli("down", "--name", "cli-test")
    assert gone.returncode == 1 and "no retrieval deployment named 'cli-test'" in gone.stderr


def test_training_ranks_span_both_nodes_and_find_the_retriever_through_the_cluster(cluster, deployment, workspace,
                                                                                   tmp_path):
    """Guards against a trainer that cannot join an existing cluster (RAY_ADDRESS) or that packs every rank on one
    node, and against ray:// lookup failing from the trainer's process: trainer.nnodes=2 x n_gpus_per_node=1 on
    the two-node cluster places rank 0 and rank 1 on different nodes, resolves retriever.url=ray://NAME, and
    finishes a training step with exit status 0. The driver runs in this process (tests/entry_points.py), which
    first disconnects from the cluster so that the trainer joins it itself through RAY_ADDRESS (the deployment is
    detached: it stays); the ranks are Ray workers on the two nodes."""
    out = tmp_path / "run"
    ray.shutdown()  # this driver only disconnects: the cluster and the deployment stay
    try:
        done = main_ppo_in_process(*overrides(workspace, out, 1, "trainer.backend=ray", "trainer.nnodes=2",
                                              "trainer.n_gpus_per_node=1", "do_search=true",
                                              f"retriever.url=ray://{NAME}", "trainer.save_freq=-1"),
                                   ray_address=cluster.address)
    finally:
        if not ray.is_initialized():
            ray.init(address=cluster.address)  # the module's other tests and its teardown drive the cluster
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-5000:]
    placed = re.findall(r"ActorRolloutWorker: 2 Ray workers on CPUs, (\d+) node\(s\)", text)
    assert placed == ["2"], text[-5000:]
    assert [m["step"] for m in metrics(out)] == [1]
