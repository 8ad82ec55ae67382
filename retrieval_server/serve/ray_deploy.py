"""The retrieval service on a Ray cluster: every shard of an index served by replicas placed by resources,
health-checked and restarted, found by name (``retriever.url: ray://NAME``).

    ray start --head                                  # or a cluster already running; RAY_ADDRESS names it
    python -m retrieval_server.ray_service up --name wiki --index OUT --corpus C.jsonl --replicas 2 --num-cpus 4
    python -m retrieval_server.ray_service status --name wiki
    python -m retrieval_server.ray_service down --name wiki

Choices (the replicas, the deployment actor and its health loop: ``ray_actors.py``):
- Ray is joined, never started, here: ``RAY_ADDRESS`` or ``--address`` (default ``auto``: the cluster that
  ``ray start`` started on this machine). A detached deployment needs a cluster that outlives this command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from retrieval_server.serve.ray_actors import DeploymentError, DeploymentSpec, RetrievalDeployment

NAMESPACE = "search_r1_retrieval"
SCHEME = "ray://"


# ----------------------------------------------------------------------------------------------
# Connect, deploy, look up


RAY_TIMEOUT_S = 30.0  # the default of --ray-timeout (and of the trainer's trainer.ray_timeout_s)


def connect(address: str | None = None, timeout_s: float = RAY_TIMEOUT_S) -> None:
    """Join the Ray cluster at ``address`` (default: ``RAY_ADDRESS``, else the one ``ray start`` runs here), giving up
    after ``timeout_s`` with a ``DeploymentError`` naming the address: Ray itself retries a cluster that is not there
    for ever. A ``host:port`` address is probed over TCP first; the join runs in a daemon thread, abandoned at the
    deadline. ``verl.utils.ray_cluster.join_ray_cluster`` does the same for the trainer and the retrieval client
    (``ray://NAME``); this package imports nothing of the project, so the copy here stays."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    unreachable = (f"no Ray cluster answers at {address!r} within {timeout_s:g}s (--ray-timeout, "
                   "trainer.ray_timeout_s); start one with `ray start --head` (or set RAY_ADDRESS to a running "
                   "cluster's address, or unset it to use the one `ray start` runs on this machine)")
    deadline = time.monotonic() + timeout_s
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic())):
                    break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise DeploymentError(f"{unreachable} ({e.strerror or e})") from None
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    outcome: list[BaseException | None] = []

    def join() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread
            outcome.append(e)
    thread = threading.Thread(target=join, name="ray-join", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not outcome:
        raise DeploymentError(unreachable)
    if outcome[0] is not None:
        raise DeploymentError(f"{unreachable} ({type(outcome[0]).__name__}: {outcome[0]})") from None


def _handle(name: str):
    import ray

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def deploy(spec: DeploymentSpec, wait_s: float | None = None) -> object:
    """Start deployment ``spec`` on the connected cluster and wait (up to ``wait_s``, default the spec's start
    timeout) until every replica is up; returns its actor handle. ``DeploymentError`` if the name is taken or the
    replicas do not come up (the deployment is then removed)."""
    import ray

    spec.check()
    if _handle(spec.name) is not None:
        raise DeploymentError(f"a retrieval deployment named {spec.name!r} is already running; stop it first with "
                              f"python -m retrieval_server.ray_service down --name {spec.name}")
    actor = ray.remote(RetrievalDeployment).options(
        name=spec.name, namespace=NAMESPACE, lifetime="detached", max_restarts=-1, num_cpus=0,
        max_concurrency=8).remote(asdict(spec))
    start = time.monotonic()
    deadline = start + (spec.start_timeout_s if wait_s is None else wait_s)
    while True:
        status = ray.get(actor.status.remote())
        if all(slot["state"] == "up" for slot in status["slots"]):
            return actor
        if time.monotonic() > deadline:
            undeploy(spec.name)
            raise DeploymentError(
                f"deployment {spec.name!r} not up after {time.monotonic() - start:.0f}s; replicas: "
                f"{json.dumps(status['slots'], indent=1)}\n(a replica still 'starting' may be waiting for resources: "
                f"each asks for {spec.num_cpus:g} CPU, {spec.num_gpus:g} GPU, resources {spec.resources}; the "
                f"cluster has {ray.available_resources()} free)")
        time.sleep(0.5)


def undeploy(name: str) -> bool:
    """Stop deployment ``name`` and its replicas; False if there is none."""
    import ray

    actor = _handle(name)
    if actor is None:
        return False
    try:
        ray.get(actor.shutdown.remote(), timeout=120)
    finally:
        ray.kill(actor, no_restart=True)
    return True


def deployment_status(name: str) -> dict:
    import ray

    actor = _handle(name)
    if actor is None:
        raise DeploymentError(f"no retrieval deployment named {name!r} in Ray namespace {NAMESPACE!r}")
    return ray.get(actor.status.remote(), timeout=60)


def resolve_endpoints(url: str, timeout: float = 60.0, connect_timeout_s: float = RAY_TIMEOUT_S) -> list[str]:
    """The URLs of the replicas that are up in deployment ``ray://NAME`` (joining the cluster if needed, within
    ``connect_timeout_s``)."""
    import ray

    name = url[len(SCHEME):].strip("/") if url.startswith(SCHEME) else url
    connect(timeout_s=connect_timeout_s)
    actor = _handle(name)
    if actor is None:
        raise DeploymentError(f"{url}: no retrieval deployment named {name!r} on the Ray cluster; start it with "
                              f"python -m retrieval_server.ray_service up --name {name} --index ... --corpus ...")
    try:
        return ray.get(actor.endpoints.remote(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise DeploymentError(f"{url}: the deployment did not answer within {timeout:g}s") from None


# ----------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def cluster_options(default) -> argparse.ArgumentParser:  # before or after the command (default once)
        common = argparse.ArgumentParser(add_help=False)
        common.add_argument("--address", default=None if default else argparse.SUPPRESS,
                            help="Ray cluster address (default: RAY_ADDRESS, else auto)")
        common.add_argument("--ray-timeout", type=float, default=RAY_TIMEOUT_S if default else argparse.SUPPRESS,
                            metavar="SECONDS", help=f"give up joining the cluster after this many seconds (default "
                                                    f"{RAY_TIMEOUT_S:g})")
        return common

    p = argparse.ArgumentParser(prog="python -m retrieval_server.ray_service", description=__doc__.split("\n")[0],
                                parents=[cluster_options(True)])
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a deployment and wait until every replica is up",
                        parents=[cluster_options(False)])
    up.add_argument("--name", required=True, help="deployment name; the trainer uses retriever.url=ray://NAME")
    up.add_argument("--index", required=True, help="index directory (whole, or holding shard-i from --shards)")
    up.add_argument("--corpus", required=True, help="the JSONL corpus the index was built from")
    up.add_argument("--replicas", type=int, default=1, help="servers per shard")
    up.add_argument("--num-cpus", type=float, default=1.0, help="CPUs each replica reserves")
    up.add_argument("--num-gpus", type=float, default=0.0, help="GPUs each replica reserves (to use them, pass "
                                                                "--faiss-gpu and/or --encoder-device cuda to serve "
                                                                "after --)")
    up.add_argument("--memory-gb", type=float, default=None, help="memory each replica reserves (Ray scheduling)")
    up.add_argument("--resources", type=json.loads, default={},
                    help='Ray custom resources each replica needs, as JSON, e.g. \'{"retrieval": 1}\'')
    up.add_argument("--host", default=None, help="interface the servers bind (default: the node's cluster IP)")
    up.add_argument("--health-interval", type=float, default=5.0, help="seconds between health checks")
    up.add_argument("--health-failures", type=int, default=3, help="failed checks in a row before a restart")
    up.add_argument("--wait", type=float, default=600.0, help="seconds to wait for every replica to come up")
    up.add_argument("serve_args", nargs=argparse.REMAINDER,
                    help="after --: arguments for retrieval_server.serve (e.g. -- --topk 3 --threads 4)")
    for command in ("status", "down"):
        sub.add_parser(command, parents=[cluster_options(False)]).add_argument("--name", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not 0 < args.ray_timeout < float("inf"):
        print(f"error: --ray-timeout must be a positive number of seconds, got {args.ray_timeout}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        connect(args.address, args.ray_timeout)
        if args.command == "up":
            serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
            spec = DeploymentSpec(name=args.name, index=str(Path(args.index).resolve()),
                                  corpus=str(Path(args.corpus).resolve()), replicas=args.replicas,
                                  num_cpus=args.num_cpus, num_gpus=args.num_gpus, memory_gb=args.memory_gb,
                                  resources=args.resources, host=args.host, serve_args=serve_args,
                                  health_interval_s=args.health_interval, health_failures=args.health_failures,
                                  start_timeout_s=args.wait)
            deploy(spec, wait_s=args.wait)
            status = deployment_status(args.name)
            for slot in status["slots"]:
                print(f"shard {slot['shard']} replica {slot['replica']}: {slot['url']} (node {slot['node_id'][:12]})")
            print(f"retriever.url=ray://{args.name}")
        elif args.command == "status":
            print(json.dumps(deployment_status(args.name), indent=2))
        elif not undeploy(args.name):
            print(f"no retrieval deployment named {args.name!r}", file=sys.stderr)
            return 1
    except DeploymentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
