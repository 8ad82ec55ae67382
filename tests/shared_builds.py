"""``built_once``: an expensive directory (a trained model, a trained run) built once per test run, even when
pytest-xdist spreads the tests over several worker processes (``make test`` runs ``-n 2``).

Under xdist every worker has its own session, so a session fixture runs once per worker. A fixture that returns
``built_once(tmp_path_factory, name, build)`` instead builds into the run's shared temporary root under a file
lock: the first worker to ask builds it, the others wait for the lock and then use what it built. Without xdist
it is an ordinary directory of the session's temporary root.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """``build(directory)`` once per test run -> the directory. Under pytest-xdist every worker has its own session
    (session fixtures run once per worker), so the directory lives in the run's shared temporary root and a file
    lock makes the first worker build it while the others wait, then read it. Nothing may write into it later."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # pytest-of-USER/pytest-N/: the workers' basetemps are popen-gw0, popen-gw1, ...
    path = root / f"built-{name}"
    with FileLock(f"{path}.lock"):
        if not (path / ".built").exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            build(path)
            (path / ".built").touch()
    return path
