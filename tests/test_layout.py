"""The layout of the retrieval service and the workers' model code: grouped by job, files a reader can take in.

- ``retrieval_server`` is three jobs, each a subpackage, imports pointing one way: ``index`` (what an index is on
  disk, and the commands that write one) <- ``search`` (answering queries over a loaded index) <- ``serve`` (HTTP, the
  command line, the Ray deployment). At the top only the shims users type after ``python -m``, ``logs`` (every
  command's logging setup) and ``launcher`` (the service as a subprocess).
- Every module of ``retrieval_server`` and ``verl/workers`` is at most ``MAX_LINES`` lines.
- The commands users type keep working after a move: ``python -m retrieval_server.X`` and the console scripts.

The import graph is the one ``tests/test_import_rules.py`` reads (``import_graph``).
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

from tests.test_import_rules import ROOT, import_graph

MAX_LINES = 400
JOBS = ("index", "search", "serve")  # bottom to top: a job imports its own modules and those of the jobs below
FOUNDATIONS = ("retrieval_server", "retrieval_server.logs", "retrieval_server.launcher")  # import nothing of it
# what users type after `python -m` -> the module that does the work (the shim imports that and nothing else)
SHIMS = {
    "retrieval_server.build_index": "retrieval_server.index.build",
    "retrieval_server.import_index": "retrieval_server.index.import_faiss",
    "retrieval_server.ray_service": "retrieval_server.serve.ray_deploy",
    "retrieval_server.serve.__main__": "retrieval_server.serve.cli",
}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, ("retrieval_server",))


def job_of(module: str) -> int | None:
    """The rank in ``JOBS`` of the subpackage ``module`` belongs to; None for a module at the top."""
    parts = module.split(".")
    return JOBS.index(parts[1]) if len(parts) > 1 and parts[1] in JOBS else None


def job_violations(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b (why)`` for each import the layout does not allow, and ``a (why)`` for a module in no group."""
    bad = []
    for a in sorted(graph):
        if a in SHIMS:
            allowed = {SHIMS[a], SHIMS[a].rpartition(".")[0]}
            bad += [f"{a} -> {b} (a shim imports only {SHIMS[a]})" for b in sorted(graph[a] - allowed)]
        elif a in FOUNDATIONS:
            bad += [f"{a} -> {b} (a top-level module imports nothing of the package)" for b in sorted(graph[a])]
        elif job_of(a) is None:
            bad.append(f"{a} (in no job: move it into {', '.join(JOBS)}, or make it a shim listed in SHIMS)")
        else:
            for b in sorted(graph[a]):
                jb = job_of(b)
                if b in SHIMS or (jb is None and b not in FOUNDATIONS) or (jb is not None and jb > job_of(a)):
                    bad.append(f"{a} -> {b} ({JOBS[job_of(a)]} -> {JOBS[jb] if jb is not None else 'top'})")
    return bad


def test_retrieval_server_is_grouped_by_job_with_imports_one_way(graph):
    """Guards against the flat package of 25 modules (index building, search and serving side by side, a 533-line
    ray_service.py) coming back, and against a lower job reaching up (an index module importing the service)."""
    assert {job_of(m) for m in graph} >= {0, 1, 2}
    bad = job_violations(graph)
    assert not bad, "\n".join(bad)


def test_the_checker_finds_an_upward_import_and_a_stray_module(graph):
    """Guards against a layout check that cannot fail."""
    assert job_violations({**graph, "retrieval_server.index.x": {"retrieval_server.serve.app"}}) == [
        "retrieval_server.index.x -> retrieval_server.serve.app (index -> serve)"]
    assert job_violations({**graph, "retrieval_server.stray": set()}) == [
        "retrieval_server.stray (in no job: move it into index, search, serve, or make it a shim listed in SHIMS)"]
    assert job_violations({**graph, "retrieval_server.build_index": {"retrieval_server.index.corpus"}}) == [
        "retrieval_server.build_index -> retrieval_server.index.corpus (a shim imports only "
        "retrieval_server.index.build)"]


def test_modules_are_at_most_400_lines():
    """Guards against the two files a reader could not take in (retrieval_server/ray_service.py at 533 lines,
    verl/workers/model_utils.py at 461, a module of four jobs) and their successors."""
    long = {str(p.relative_to(ROOT)): n for folder in ("retrieval_server", "verl/workers")
            for p in sorted((ROOT / folder).rglob("*.py")) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


@pytest.mark.parametrize("module", ["retrieval_server.build_index", "retrieval_server.import_index",
                                    "retrieval_server.serve", "retrieval_server.ray_service"])
def test_the_commands_users_type_still_run(module):
    """Guards against a move that leaves ``python -m retrieval_server.X`` (README, retrieval_launch.sh, the Ray
    replicas, data_prep.wiki_nq) pointing at nothing: each still prints its own usage."""
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m {module}"), done.stderr[-2000:]


def test_console_scripts_point_at_functions():
    """Guards against setup.py's console commands naming a module the move emptied (a wheel's
    ``search-r1-retrieve`` would fail at its first import)."""
    scripts = re.findall(r'"(search-r1-[a-z-]+) = (retrieval_server[\w.]*):(\w+)"', (ROOT / "setup.py").read_text())
    assert len(scripts) == 3
    for name, module, function in scripts:
        assert callable(getattr(importlib.import_module(module), function, None)), f"{name}: {module}:{function}"
