"""Session fixtures of retrieval servers shared by test directories: the small hand-written corpus
(``tests/retrieval_server/retrieval_test_corpus.py``), its dense flat index and server, and servers of that corpus's
shards (``shard_sets``), used by tests/retrieval_server/test_shards.py and tests/test_user_errors_surfaces.py alike.

Defined here and imported by ``tests/conftest.py``. Each server is a real ``python -m retrieval_server.serve`` on a
loopback port (~5 s of start-up each); under pytest-xdist the two modules that query the shard servers form one
scope (``tests/conftest.py``: SHARED_SCOPES), so the servers are started once per test run. Nothing stops them
before the session ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess
from tests.retrieval_server.retrieval_test_corpus import corpus_lines

SERVER_ARGS = ["--threads", "1", "--topk", "3", "--max-topk", "10", "--max-queries", "8", "--max-query-chars", "64"]


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("\n".join(corpus_lines()) + "\n")
    return path


@pytest.fixture(scope="session")
def flat_index(corpus_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("index_flat")
    build_index(corpus_path, out, retriever="dense", index="flat", progress=False)
    return out


@pytest.fixture(scope="session")
def flat_server(flat_index, corpus_path):
    """Shared by the modules that query it (none stops it): started once per test process."""
    with ServerProcess(flat_index, corpus_path, SERVER_ARGS) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="session")
def shard_builds(corpus_path, tmp_path_factory):
    """``shard_builds(name)`` -> ``(directory of shard-0 ... shard-N-1, its corpus)``, built on first use: ``two``
    and ``three``: the corpus in 2 and in 3 shards; ``other``: another corpus (the same passages in reverse order)
    in 2 shards."""
    root = tmp_path_factory.mktemp("shards")
    other = root / "other.jsonl"
    other.write_text("\n".join(reversed(corpus_lines())) + "\n")
    builds = {"two": (corpus_path, 2), "three": (corpus_path, 3), "other": (other, 2)}
    built: dict[str, Path] = {}

    def get(name: str) -> tuple[Path, Path]:
        corpus, n = builds[name]
        if name not in built:
            build_index(corpus, root / name, shards=n, progress=False)
            built[name] = root / name
        return built[name], corpus

    return get


@pytest.fixture(scope="session")
def shard_sets(shard_builds):
    """URLs of servers of: the corpus in 2 and in 3 shards, ``(name, shard)``; shard 1 of 2 of another corpus (same
    passages, reversed order), ``("other", 1)``."""
    wanted = [("two", 0), ("two", 1), ("three", 0), ("three", 1), ("three", 2), ("other", 1)]
    servers = {}
    try:
        for name, i in wanted:
            directory, corpus = shard_builds(name)
            servers[name, i] = ServerProcess(directory / f"shard-{i}", corpus, SERVER_ARGS)
        for server in servers.values():
            server.wait_ready()
        yield {key: server.url for key, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
