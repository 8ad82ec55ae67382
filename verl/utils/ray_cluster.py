"""Joining a running Ray cluster within a deadline, for the trainer's worker groups
(``verl.single_controller.ray_group.join_cluster``) and a task's services reached by a Ray actor's name (for
example the retrieval client's ``ray://NAME`` endpoints, ``search_r1.search.endpoints``).

``ray.init(address=...)`` retries a cluster that is not there for ever ("Failed to connect to GCS" every 5 s).
Here a ``host:port`` address is first probed over TCP (nothing listening fails at once); the join then runs in a
daemon thread, abandoned at the deadline. ``retrieval_server.serve.ray_deploy.connect`` does the same for the service's
command line (that package imports nothing of the project, so it keeps its own copy).

Ray is imported only when a join is attempted.
"""

from __future__ import annotations

import socket
import threading
import time


def join_ray_cluster(address: str, timeout_s: float, unreachable: str, error: type[Exception] = RuntimeError,
                     **init_kwargs) -> None:
    """``ray.init(address=address, **init_kwargs)`` that gives up after ``timeout_s``, raising ``error`` with the
    message ``unreachable`` (followed by the cause in parentheses when one is known)."""
    import ray

    deadline = time.monotonic() + timeout_s
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic())):
                    break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise error(f"{unreachable} ({e.strerror or e})") from None
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    outcome: list[BaseException | None] = []

    def join() -> None:
        try:
            ray.init(address=address, **init_kwargs)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread
            outcome.append(e)
    thread = threading.Thread(target=join, name="ray-join", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not outcome:
        raise error(unreachable)
    if outcome[0] is not None:
        raise error(f"{unreachable} ({type(outcome[0]).__name__}: {outcome[0]})") from None
