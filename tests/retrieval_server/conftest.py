"""Fixtures of the retrieval-service tests: a small hand-written corpus, its real indexes, real servers.

Servers are the project's own ``python -m retrieval_server.serve`` started on a free loopback port
(``ServerProcess``), with small request limits so the 4xx tests stay small, and one search thread
(numba compiles its serial kernel faster than the parallel one). The corpus, its dense flat index and server and
the shard servers are in ``tests/retrieval_servers.py`` (shared with tests/test_user_errors_surfaces.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess
from tests.retrieval_servers import SERVER_ARGS

__all__ = ["SERVER_ARGS"]  # imported from here by some modules of this directory


@pytest.fixture(scope="session")
def bm25_index(corpus_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("index_bm25")
    build_index(corpus_path, out, retriever="bm25", progress=False)
    return out


@pytest.fixture(scope="session")
def bm25_server(bm25_index, corpus_path):
    """Shared by the modules that query it (none stops it): started once per test process."""
    with ServerProcess(bm25_index, corpus_path, SERVER_ARGS) as server:
        server.wait_ready()
        yield server
