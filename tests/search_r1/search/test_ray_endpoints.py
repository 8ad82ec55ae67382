"""``ray://NAME`` endpoints are looked up through Ray's own API, not by importing the service's module
(``search_r1`` imports only ``verl``, ``tests/test_import_rules.py``). Guards against the client and the service
drifting apart on the contract that replaces the import (the actor's namespace, the scheme, its ``endpoints``
method) and against a lookup that waits for ever on a cluster that is not there."""

from __future__ import annotations

import socket
import time

import pytest

from retrieval_server.serve import ray_deploy as ray_service
from search_r1.search import endpoints


def test_the_client_and_the_service_agree_on_the_ray_contract():
    assert endpoints.RAY_NAMESPACE == ray_service.NAMESPACE
    assert endpoints.RAY_SCHEME == ray_service.SCHEME
    assert callable(ray_service.RetrievalDeployment.endpoints)


def test_a_dead_ray_address_is_a_lookup_error_within_the_timeout(monkeypatch):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("Ray is initialised in this process: no join is attempted")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(endpoints.EndpointLookupError, match=rf"127\.0\.0\.1:{port}.*within 2s.*ray start --head"):
        endpoints.resolve_urls(["http://a:1", "ray://wiki"], ray_timeout_s=2)
    assert time.monotonic() - start < 30
