"""Run ``retrieval_server.serve`` as a subprocess on a free loopback port (tests and benchmarks).

Choices: the server's output goes to a temporary log file (a pipe nobody reads would fill up and
block the server); ``wait_ready`` polls ``/health`` and fails fast, with the log tail, if the
process exits; ``stop`` sends SIGTERM (graceful uvicorn shutdown), then SIGKILL after a grace period.
``source`` runs the server of another checkout of this project (the benchmark's baseline).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A running ``python -m retrieval_server.serve``; use as a context manager to stop it on exit.

    ``command`` replaces the default command (e.g. ``retrieval_launch.sh`` or an installed ``search-r1-retrieve``,
    which must listen on ``port``); ``cwd`` and ``env`` are its working directory and environment.
    """

    def __init__(self, index_dir: str | Path | None = None, corpus: str | Path | None = None,
                 extra_args: list[str] | None = None, port: int | None = None, source: str | Path | None = None,
                 command: list[str] | None = None, cwd: str | Path | None = None, env: dict[str, str] | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.health_seen: list[str] = []  # "status" values /health answered, in order (deduplicated)
        self._log = tempfile.NamedTemporaryFile(prefix="retrieval_server_", suffix=".log", delete=False)
        cmd = command or [sys.executable, "-m", "retrieval_server.serve", "--index", str(index_dir), "--corpus",
                          str(corpus), "--port", str(self.port), *(extra_args or [])]
        if source is not None:
            env, cwd = {**(env or os.environ), "PYTHONPATH": str(Path(source).resolve())}, source
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd, env=env)

    def memory(self) -> dict[str, int]:
        """The server process's resident memory in MiB (Linux): ``VmRSS`` = ``RssAnon`` (private) + ``RssFile``
        (file pages, e.g. a memory-mapped index; the OS can evict them) + ``RssShmem``; ``VmHWM`` = peak VmRSS."""
        fields = ("VmRSS", "RssAnon", "RssFile", "VmHWM")
        with open(f"/proc/{self.proc.pid}/status") as f:
            rows = [line.split() for line in f if line.split(":")[0] in fields]
        return {row[0].rstrip(":"): int(row[1]) // 1024 for row in rows}

    def log_text(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> dict:
        """Poll ``/health`` until it answers 200; returns its JSON. If the process exits or time runs out, it is
        stopped (a caller that never got a ready server holds nothing to stop) and the error carries its log's end."""
        try:
            return self._poll_health(timeout)
        except BaseException:
            self.stop()
            raise

    def _poll_health(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with status {self.proc.returncode}:\n{self.log_text()[-3000:]}")
                try:
                    response = client.get(self.url + "/health")
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                status = response.json().get("status", "?")
                if not self.health_seen or self.health_seen[-1] != status:
                    self.health_seen.append(status)
                if response.status_code == 200:
                    return response.json()
                time.sleep(0.05)
        raise TimeoutError(f"server at {self.url} not ready after {timeout:.0f}s:\n{self.log_text()[-3000:]}")

    def wait_exit(self, timeout: float = 120.0) -> int:
        """Wait for the process to end by itself; returns its exit status."""
        return self.proc.wait(timeout)

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
