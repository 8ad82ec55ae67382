"""The Ray actors of a retrieval deployment (``ray_deploy.py`` starts, finds and stops them): a replica runs a
server, the deployment keeps every shard's replicas served.

Choices:
- One replica = one Ray actor (``ReplicaServer``) that runs the project's own ``python -m retrieval_server.serve``
  as a child process on its node: the same checks, batching and limits as a server started by hand. The child is
  started with ``PR_SET_PDEATHSIG`` so it dies with its actor (no orphan server holding the index's memory).
  It binds the node's cluster IP (``--host`` overrides): the service has no authentication, so it is reachable on
  the cluster's network only, not on every interface.
- Placement by resources: each replica actor asks for ``--num-cpus`` / ``--num-gpus`` / ``--memory-gb`` and any
  ``--resources`` (Ray custom resources, e.g. a label a node was started with), scheduled with Ray's ``SPREAD``
  strategy so that replicas of a shard land on different nodes when they can. The index and corpus paths must
  exist on every node that can host a replica (a shared file system, or the same path everywhere).
- One detached, named actor per deployment (``RetrievalDeployment``, name ``NAME`` in the namespace
  ``ray_deploy.NAMESPACE``) owns the replicas. It outlives the ``up`` command, so the trainer (another Ray driver on
  the cluster) finds it with ``ray.get_actor``; its ``max_restarts=-1`` makes Ray restart it (and with it, its
  replicas) if its process dies. Its health loop asks each replica every ``--health-interval`` seconds to check its
  server (process alive and ``GET /health`` answers 200); after ``--health-failures`` failed checks in a row, or
  when the replica's actor or node is gone, the replica is killed and a new one started (possibly on another node,
  with a new URL).
- ``endpoints()`` lists the URLs of the replicas that are up. The client (``search_r1.search.endpoints``) groups
  them into shards from their ``/health`` as for hand-listed URLs, sends them ``/retrieve`` and ``/doc`` (whole
  documents, ``search/documents.py``: each replica is an ordinary server), and looks them up again when every
  replica of a shard fails (``RetrievalClient._refresh``), which is how it follows a restart. The client imports
  none of this package: it finds the actor by ``NAME`` in ``ray_deploy.NAMESPACE`` through Ray's API and calls
  ``endpoints()``, so those three are a contract like ``/retrieve`` (``tests/search_r1/search/test_ray_endpoints.py``
  checks they agree).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from retrieval_server.index.manifest import MANIFEST_NAME, Manifest
from retrieval_server.index.shards import SHARD_DIR

logger = logging.getLogger(__name__)


class DeploymentError(RuntimeError):
    """A deployment cannot be found, started or reached; the message says which and what to do."""


# ----------------------------------------------------------------------------------------------
# What to deploy


@dataclass
class DeploymentSpec:
    """One deployment: the index (whole, or ``OUT`` holding ``shard-i``), its corpus, replicas per shard and what
    each replica asks of the cluster."""

    name: str
    index: str
    corpus: str
    replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory_gb: float | None = None
    resources: dict[str, float] = field(default_factory=dict)
    host: str | None = None  # None: the node's cluster IP
    serve_args: list[str] = field(default_factory=list)
    health_interval_s: float = 5.0
    health_timeout_s: float = 10.0
    health_failures: int = 3
    start_timeout_s: float = 600.0

    def check(self) -> None:
        if not self.name or "/" in self.name or "," in self.name:
            raise DeploymentError(f"--name {self.name!r}: give a non-empty name without '/' or ','")
        if self.replicas < 1:
            raise DeploymentError(f"--replicas must be at least 1, got {self.replicas}")
        numbers = {"--num-cpus": self.num_cpus, "--num-gpus": self.num_gpus, "--memory-gb": self.memory_gb or 1.0,
                   "--health-interval": self.health_interval_s, "--wait": self.start_timeout_s}
        for flag, value in numbers.items():
            if not math.isfinite(value):
                raise DeploymentError(f"{flag} must be a finite number, got {value}")
        if self.num_cpus < 0 or self.num_gpus < 0 or (self.memory_gb is not None and self.memory_gb <= 0):
            raise DeploymentError("--num-cpus and --num-gpus must be >= 0 and --memory-gb > 0")
        if self.health_failures < 1 or self.health_interval_s <= 0:
            raise DeploymentError("--health-failures must be >= 1 and --health-interval > 0")
        index_dirs(self.index)
        if not Path(self.corpus).is_file():
            raise DeploymentError(f"--corpus {self.corpus}: no such file")


def index_dirs(index: str | Path) -> list[Path]:
    """The directories to serve: ``[index]`` for a whole index, ``index/shard-0 .. shard-(n-1)`` for a sharded one
    (``build_index --shards``); ``DeploymentError`` when neither, or when a shard is missing."""
    root = Path(index)
    if (root / MANIFEST_NAME).is_file():
        return [root]
    shard_dirs = sorted(root.glob(SHARD_DIR.format("*") + "/" + MANIFEST_NAME))
    if not shard_dirs:
        raise DeploymentError(f"--index {index}: no {MANIFEST_NAME} in it nor in {SHARD_DIR.format('i')}/ under it; "
                              "give a directory written by retrieval_server.build_index (with or without --shards)")
    shards = {}
    for path in shard_dirs:
        info = Manifest.load(path.parent).index_params.get("shard") or {}
        shards[info.get("index")] = (path.parent, info.get("of"))
    n = {of for _, of in shards.values()}
    if len(n) != 1 or set(shards) != set(range(n.pop())):
        have = ", ".join(str(p) for p, _ in shards.values())
        raise DeploymentError(f"--index {index}: the shards found ({have}) are not one complete set; rebuild with "
                              "build_index --shards N")
    return [shards[i][0] for i in range(len(shards))]


# ----------------------------------------------------------------------------------------------
# One replica: an actor that runs a server


def _die_with_parent() -> None:
    """In the server child: ask the kernel to SIGTERM it when its parent (the replica actor) exits (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ReplicaServer:
    """A Ray actor running ``python -m retrieval_server.serve`` over one index directory on its node."""

    def __init__(self, index_dir: str, corpus: str, host: str | None, serve_args: list[str]):
        import ray

        self.host = host or ray.util.get_node_ip_address()
        with socket.socket() as sock:  # a free port on that interface; serve re-checks the bind and exits 2 if taken
            sock.bind((self.host, 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        self.node_id = ray.get_runtime_context().get_node_id()
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"retrieval_replica_{os.getpid()}_{self.port}.log"
        cmd = [sys.executable, "-m", "retrieval_server.serve", "--index", index_dir, "--corpus", corpus,
               "--host", self.host, "--port", str(self.port), *serve_args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def info(self) -> dict:
        return {"url": self.url, "node_id": self.node_id, "pid": self.proc.pid}

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def check(self, timeout: float = 10.0) -> tuple[bool, str]:
        """(server up, why not): the process is alive and ``GET /health`` answers 200."""
        if self.proc.poll() is not None:
            last = " | ".join(self._log_tail().strip().splitlines()[-3:])
            return False, f"server exited with status {self.proc.returncode} (log {self.log_path}: ... {last})"
        try:
            response = httpx.get(self.url + "/health", timeout=timeout)
        except httpx.TransportError as e:
            return False, f"{type(e).__name__}: {e}"
        return response.status_code == 200, f"/health answered {response.status_code}"

    def wait_ready(self, timeout: float) -> dict:
        """Block until the server is up (returns ``info()``); raises with the server's log when it exits or times
        out."""
        deadline = time.monotonic() + timeout
        while True:
            ok, why = self.check(timeout=2.0)
            if ok:
                return self.info()
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise DeploymentError(f"replica server at {self.url} did not come up ({why}); log:\n"
                                      f"{self._log_tail()}")
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# ----------------------------------------------------------------------------------------------
# The deployment: a detached actor that keeps every slot served


def shorten_problem(problem: str, limit: int = 500) -> str:
    """``problem`` cut to about ``limit`` characters for the status report, keeping its head (the cause, e.g.
    "server exited with status -9") and its tail (the end of the server's log); the middle gives way."""
    if len(problem) <= limit:
        return problem
    head = limit // 2
    return f"{problem[:head]} ... {problem[-(limit - head - 5):]}"


@dataclass
class _Slot:
    shard: int
    replica: int
    index_dir: str
    actor: object = None
    ready: object = None  # ObjectRef of wait_ready while starting
    state: str = "new"  # new | starting | up
    info: dict = field(default_factory=dict)
    failures: int = 0
    restarts: int = 0
    last_problem: str = ""


class RetrievalDeployment:
    """Starts ``replicas`` servers per shard and keeps them up (module docstring)."""

    def __init__(self, spec: dict):
        self.spec = DeploymentSpec(**spec)
        dirs = index_dirs(self.spec.index)
        self.slots = [_Slot(s, r, str(d)) for s, d in enumerate(dirs) for r in range(self.spec.replicas)]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health", daemon=True)
        self._thread.start()

    # -- the health loop --------------------------------------------------------------------------

    def _start(self, slot: _Slot) -> None:
        import ray

        spec = self.spec
        options = {"num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus, "scheduling_strategy": "SPREAD",
                   "resources": dict(spec.resources), "max_concurrency": 4}
        if spec.memory_gb:
            options["memory"] = int(spec.memory_gb * 2**30)
        slot.actor = ray.remote(ReplicaServer).options(**options).remote(slot.index_dir, spec.corpus, spec.host,
                                                                        spec.serve_args)
        slot.ready = slot.actor.wait_ready.remote(spec.start_timeout_s)
        slot.state, slot.failures = "starting", 0

    def _replace(self, slot: _Slot, problem: str) -> None:
        import ray

        logger.warning("deployment %s: replica %d of shard %d (%s) failed: %s; starting a new one", self.spec.name,
                       slot.replica, slot.shard, slot.info.get("url", "not started"), problem)
        if slot.actor is not None:
            try:
                ray.get(slot.actor.stop.remote(), timeout=15)
            except Exception:  # noqa: BLE001 -- the actor may be dead already; it is killed next either way
                pass
            ray.kill(slot.actor)
        slot.actor, slot.ready, slot.state, slot.info = None, None, "new", {}
        slot.restarts += 1
        slot.last_problem = shorten_problem(problem)

    def _tick(self) -> None:
        import ray

        for slot in self.slots:
            if slot.state == "new":
                self._start(slot)
            elif slot.state == "starting":
                done, _ = ray.wait([slot.ready], timeout=0)
                if done:
                    try:
                        info = ray.get(slot.ready)
                    except Exception as e:  # noqa: BLE001 -- the server did not come up, or the actor/node died
                        self._replace(slot, f"{type(e).__name__}: {e}")
                    else:
                        with self._lock:
                            slot.info, slot.state, slot.ready = info, "up", None
            else:
                try:
                    ok, why = ray.get(slot.actor.check.remote(self.spec.health_timeout_s),
                                      timeout=self.spec.health_timeout_s + 5)
                except Exception as e:  # noqa: BLE001 -- actor or node gone, or the check hung
                    ok, why = False, f"{type(e).__name__}: {e}"
                slot.failures = 0 if ok else slot.failures + 1
                dead_process = not ok and why.startswith("server exited")
                if not ok and (dead_process or slot.failures >= self.spec.health_failures):
                    with self._lock:
                        self._replace(slot, why)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception:  # noqa: BLE001 -- one bad tick must not end the health loop
                logger.exception("deployment %s: health check failed", self.spec.name)
            self._stop.wait(min(self.spec.health_interval_s, 0.5) if self._starting() else
                            self.spec.health_interval_s)

    def _starting(self) -> bool:
        return any(slot.state != "up" for slot in self.slots)

    # -- what callers ask -------------------------------------------------------------------------

    def endpoints(self) -> list[str]:
        """The URLs of the replicas that are up now."""
        with self._lock:
            return [slot.info["url"] for slot in self.slots if slot.state == "up"]

    def status(self) -> dict:
        with self._lock:
            return {"spec": asdict(self.spec), "slots": [
                {"shard": s.shard, "replica": s.replica, "state": s.state, "restarts": s.restarts,
                 "last_problem": s.last_problem, **s.info} for s in self.slots]}

    def shutdown(self) -> None:
        import ray

        self._stop.set()
        self._thread.join(timeout=30)
        for slot in self.slots:
            if slot.actor is not None:
                try:
                    ray.get(slot.actor.stop.remote(), timeout=15)
                except Exception:  # noqa: BLE001 -- already dead
                    pass
                ray.kill(slot.actor)
                slot.actor, slot.state = None, "new"
