"""The project's import rules, checked on its import graph: the one place the layer table lives.

The graph: one node per module of ``PACKAGES`` (``pkg/__init__.py`` is ``pkg``), one edge per ``import`` or
``from ... import`` that names a project module, read with ``ast``: every import, also inside functions and
methods; imports under ``if TYPE_CHECKING:`` are left out (they never run); relative imports are resolved
against the importing module's package. ``from a.b import c`` is an edge to ``a.b.c`` when that is a module,
and to ``a.b`` either way; ``import a.b.c`` names the deepest module that exists. Names imported with
``importlib`` (the recipe seam, ``verl.trainer.recipe.load_recipe``) are strings, not edges. A benchmark script
may import a sibling script by its bare name (``benchmarks/`` is put on ``sys.path``): that resolves to
``benchmarks.NAME``.

The rules (``MAY_IMPORT``, ``VERL_LAYERS``), described in docs/design.md, "Layout and import rules":

- no circles: no strongly connected component of more than one module;
- a package imports only itself and the packages ``MAY_IMPORT`` lists;
- inside ``verl``, a module imports only modules of its own layer or of lower ones (an "upward arrow" fails);
  every ``verl`` module is in exactly one layer.

Each violation is printed as ``module -> module (layer -> layer)``. ``python tests/test_import_rules.py`` prints
the graph's figures and the violations.
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("verl", "search_r1", "retrieval_server", "data_prep", "benchmarks")

# package -> the other project packages it may import (itself always).
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "retrieval_server": (),  # a service of its own: reached over HTTP (or by its Ray actor's name), never imported
    "verl": (),  # the generic trainer knows no task; it reaches the recipe by the module name in the config
    "search_r1": ("verl",),
    "data_prep": ("search_r1", "verl"),
    "benchmarks": ("verl", "search_r1", "retrieval_server", "data_prep"),  # scripts: anything (tests too)
}

# verl's layers, bottom to top: the module names (after ``verl.``, first part; fnmatch patterns) in each. A module
# may import its own layer and the layers below it. ``verl`` itself (an empty __init__) is in the bottom layer.
VERL_LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "protocol", "utils"),
    ("algorithms",),
    # config, config_checks, config_compat, config_doc: read the algorithm registries; tools: the tool registry and
    # the tool config (verl.tools.run_tool_specs reads the config)
    ("config*", "tools"),
    ("workers",),
    ("single_controller",),
    ("trainer",),
)


# ----------------------------------------------------------------------------------------------
# The graph


def project_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under each package folder of ``root``."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom node of ``tree`` except those in the body of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest project module that ``name`` (a dotted import path) names, None when none."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that ``module`` (at ``path``) imports, itself left out."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parent = package[:len(package) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            found = _resolve(name, modules)
            relative = isinstance(node, ast.ImportFrom) and node.level > 0
            if found is None and not relative and module.split(".")[0] == "benchmarks":
                found = _resolve(f"benchmarks.{name}", modules)  # a sibling script by its bare name
            if found is not None and found != module:
                targets.add(found)
    return targets


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    modules = project_modules(root, packages)
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


# ----------------------------------------------------------------------------------------------
# The checks


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def package_of(module: str) -> str:
    return module.split(".")[0]


def package_violations(graph: dict[str, set[str]], may_import: dict[str, tuple[str, ...]] = MAY_IMPORT
                       ) -> list[str]:
    """``a -> b (package -> package)`` for each import of a package that ``may_import`` does not allow."""
    bad = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            pa, pb = package_of(a), package_of(b)
            if pa != pb and pb not in may_import.get(pa, ()):
                bad.append(f"{a} -> {b} ({pa} -> {pb})")
    return bad


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = VERL_LAYERS) -> tuple[int, str] | None:
    """(rank, name) of the verl layer ``module`` is in: the rank of the pattern its first part below ``verl``
    matches, and that part; ``verl`` itself is rank 0. None when no pattern matches."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0, parts[0]
    for rank, patterns in enumerate(layers):
        if any(fnmatch.fnmatchcase(parts[1], pattern) for pattern in patterns):
            return rank, parts[1]
    return None


def layer_violations(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = VERL_LAYERS) -> list[str]:
    """``a -> b (layer -> layer)`` for each verl import from a lower layer to a higher one, and ``a (no layer)``
    for each verl module no layer names."""
    bad = []
    for a in sorted(graph):
        if package_of(a) != "verl":
            continue
        la = layer_of(a, layers)
        if la is None:
            bad.append(f"{a} (no layer: add it to VERL_LAYERS in tests/test_import_rules.py)")
            continue
        for b in sorted(graph[a]):
            lb = layer_of(b, layers) if package_of(b) == "verl" else None
            if lb is not None and lb[0] > la[0]:
                bad.append(f"{a} -> {b} ({la[1]} -> {lb[1]})")
    return bad


def describe_layers(layers: tuple[tuple[str, ...], ...] = VERL_LAYERS) -> str:
    """The layers as docs/design.md states them: ``a``, ``b`` -> ``c`` -> ..."""
    return " -> ".join(", ".join(f"`{p}`" for p in patterns) for patterns in layers)


def figures(graph: dict[str, set[str]]) -> dict[str, int]:
    task = [(a, b) for a in graph for b in graph[a]
            if package_of(a) == "verl" and package_of(b) in ("search_r1", "retrieval_server")]
    upward = [v for v in layer_violations(graph) if "->" in v]
    return {"modules": len(graph), "imports": sum(map(len, graph.values())), "circles": len(circles(graph)),
            "upward arrows": len(upward), "verl->task imports": len(task),
            "package violations": len(package_violations(graph))}


# ----------------------------------------------------------------------------------------------
# Tests


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def report(what: str, violations: list[str]) -> str:
    text = f"{len(violations)} {what}:\n" + "\n".join(f"  {v}" for v in violations)
    print(text)
    return text


def test_no_import_circles(graph):
    found = circles(graph)
    assert not found, report("import circle(s)", [" <-> ".join(c) for c in found])


def test_packages_import_only_what_the_table_allows(graph):
    assert set(MAY_IMPORT) == set(PACKAGES)
    bad = package_violations(graph)
    assert not bad, report("import(s) the package table does not allow (MAY_IMPORT)", bad)


def test_verl_layers_import_only_downward(graph):
    bad = layer_violations(graph)
    assert not bad, report("upward arrow(s) between verl's layers (VERL_LAYERS)", bad)


def test_the_graph_is_read_whole(graph):
    """Guards against a checker that sees too little to fail: modules of every package, imports inside functions,
    relative imports and benchmark siblings are all in the graph."""
    assert {package_of(m) for m in graph} == set(PACKAGES)
    assert "verl.algorithms.turn_credit" in graph["verl.algorithms"]  # from verl.algorithms import ..., turn_credit
    assert "verl.single_controller.ray_group" in graph["verl.single_controller"]  # inside a function
    assert "benchmarks.retrieval_corpus" in graph["benchmarks.bench_retrieval"]  # bare sibling name


def test_design_doc_states_this_table():
    """docs/design.md describes the table here (it does not keep a second copy that could drift)."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Layout and import rules", 1)[1].split("\n## ", 1)[0]
    assert "tests/test_import_rules.py" in section
    assert describe_layers() in section, describe_layers()


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_an_upward_arrow_and_a_circle(tmp_path):
    """A synthetic verl with one upward arrow (utils -> trainer, inside a function), one circle (two workers
    modules, one through a relative import), an upward import under TYPE_CHECKING (not an arrow) and a downward
    one (allowed)."""
    _write(tmp_path, {
        "verl/__init__.py": "",
        "verl/errors.py": "",
        "verl/utils/__init__.py": "",
        "verl/utils/helpers.py": ("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from verl.workers import a\n"
                                  "def f():\n    from verl.trainer.loop import run\n    return run\n"),
        "verl/workers/__init__.py": "",
        "verl/workers/a.py": "from . import b\nfrom verl.errors import ConfigError\n",
        "verl/workers/b.py": "import verl.workers.a\n",
        "verl/trainer/__init__.py": "",
        "verl/trainer/loop.py": "from ..workers.a import thing\n",
        "search_r1/__init__.py": "import verl.trainer.loop\n",
    })
    graph = import_graph(tmp_path, ("verl", "search_r1"))
    assert graph["verl.utils.helpers"] == {"verl.trainer.loop"}
    assert graph["verl.trainer.loop"] == {"verl.workers.a"}
    assert circles(graph) == [["verl.workers.a", "verl.workers.b"]]
    assert layer_violations(graph) == ["verl.utils.helpers -> verl.trainer.loop (utils -> trainer)"]
    assert package_violations(graph, {"verl": (), "search_r1": ("verl",)}) == []
    assert package_violations(graph, {"verl": (), "search_r1": ()}) == [
        "search_r1 -> verl.trainer.loop (search_r1 -> verl)"]
    _write(tmp_path, {"verl/extra.py": ""})
    assert layer_violations(import_graph(tmp_path, ("verl",)))[0].startswith("verl.extra (no layer")


if __name__ == "__main__":
    full = import_graph()
    print(", ".join(f"{value} {name}" for name, value in figures(full).items()))
    for c in circles(full):
        print("circle:", " <-> ".join(c))
    for violation in package_violations(full) + layer_violations(full):
        print(violation)
    sys.exit(1 if circles(full) or package_violations(full) or layer_violations(full) else 0)
