"""``ServerProcess.wait_ready``: a server that never becomes ready is stopped by it, so no caller has to."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from retrieval_server.launcher import ServerProcess


def test_a_server_that_exits_is_reported_with_its_log():
    server = ServerProcess(command=[sys.executable, "-c", "print('bad --flag given'); raise SystemExit(2)"])
    log = Path(server._log.name)
    with pytest.raises(RuntimeError, match=r"(?s)exited with status 2.*bad --flag given"):
        server.wait_ready(30)
    assert not log.exists()  # its temporary log is removed once the error holds its text


def test_a_server_that_never_answers_is_stopped_on_timeout():
    server = ServerProcess(command=[sys.executable, "-c", "import time; time.sleep(120)"])
    with pytest.raises(TimeoutError, match="not ready after"):
        server.wait_ready(0.5)
    assert server.proc.poll() is not None  # stopped, not left running after the error
    server.stop()  # a second stop (a caller's context manager) is harmless
