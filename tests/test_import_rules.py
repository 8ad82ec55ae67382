"""The project's import rules, checked on its import graph: the one place the layer table lives.

The graph: one node per module of ``PACKAGES`` (``pkg/__init__.py`` is ``pkg``), one edge per ``import`` or
``from ... import`` that names a project module, read with ``ast``: every import, also inside functions and
methods (lazy imports) and under ``if TYPE_CHECKING:`` (a type that names a module is a dependency on it: a circle
through annotations is still a circle for the reader and the type checker); relative imports are resolved
against the importing module's package. ``from a.b import c`` is an edge to ``a.b.c`` when that is a module,
and to ``a.b`` either way; ``import a.b.c`` names the deepest module that exists. Names imported with
``importlib`` (the recipe seam, ``verl.trainer.recipe.load_recipe``) are strings, not edges. A benchmark script
may import a sibling script by its bare name (``benchmarks/`` is put on ``sys.path``): that resolves to
``benchmarks.NAME``.

The rules (``MAY_IMPORT``, ``VERL_LAYERS``), described in docs/design.md, "Layout and import rules":

- no circles: no strongly connected component of more than one module (lazy and ``TYPE_CHECKING`` imports
  counted);
- a package imports only itself and the packages ``MAY_IMPORT`` lists;
- inside ``verl``, a module imports only modules of its own layer or of lower ones (an "upward arrow" fails);
  every ``verl`` module is in exactly one layer;
- ``verl`` names no task: the search task's words (``TASK_WORDS``) appear in ``verl/`` only in docstrings that say
  "for example".

Each violation is printed as ``module -> module (layer -> layer)``. ``python tests/test_import_rules.py`` prints
the graph's figures and the violations.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("verl", "search_r1", "retrieval_server", "data_prep", "benchmarks", "examples")

# package -> the other project packages it may import (itself always).
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "retrieval_server": (),  # a service of its own: reached over HTTP (or by its Ray actor's name), never imported
    "verl": (),  # the generic trainer knows no task; it reaches the recipe by the module name in the config
    "search_r1": ("verl",),
    "data_prep": ("search_r1", "verl"),
    "benchmarks": ("verl", "search_r1", "retrieval_server", "data_prep"),  # scripts: anything (tests too)
    "examples": ("verl",),  # a task in one file plugs into the trainer as search_r1 does, without search_r1
}

# verl's layers, bottom to top: the module names (after ``verl.``, first part; fnmatch patterns) in each. A module
# may import its own layer and the layers below it. ``verl`` itself (its __init__ installs ``_imports``' finder) is in
# the bottom layer.
VERL_LAYERS: tuple[tuple[str, ...], ...] = (
    ("_imports", "errors", "protocol", "utils"),
    ("algorithms",),
    # config, config_checks, config_compat, config_doc: read the algorithm registries; tools: the registries of action
    # formats and tools (the config's allowed formats) and the tool config
    ("config*", "tools"),
    ("workers",),
    ("agent",),  # the generic agent loop: engines (workers.rollout) in, trajectories out

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


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom node of ``tree``: at module level, inside functions and under ``if TYPE_CHECKING:``."""
    return (node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))


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


# The search task's words, which the generic trainer may use only to give an example (issue 58).
TASK_WORDS = re.compile(r"<information>|hermes|search_r1|retriever")


def _docstring_lines(tree: ast.AST) -> list[tuple[int, int, str]]:
    """(first line, last line, text) of every module, class and function docstring of ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                found.append((first.lineno, first.end_lineno, first.value.value))
    return found


def task_words(root: Path = ROOT, package: str = "verl") -> list[str]:
    """``path:line: text`` for each line of ``package`` naming a task word outside a docstring that says "for
    example"."""
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        text = path.read_text()
        examples = [(a, b) for a, b, doc in _docstring_lines(ast.parse(text)) if "for example" in " ".join(doc.split())]
        for number, line in enumerate(text.splitlines(), start=1):
            if TASK_WORDS.search(line) and not any(a <= number <= b for a, b in examples):
                bad.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return bad


def test_verl_names_no_task():
    """Guards against the trainer knowing the search task by name: a format name, the recipe's module, the
    ``<information>`` block or the retriever in ``verl/``'s code, settings or messages (issue 58: the format's
    choices, the default recipe, ``multi.format != "hermes"``), where only an example in a docstring may name it."""
    bad = task_words()
    assert not bad, report("line(s) of verl/ naming the search task outside a 'for example' docstring", bad)


def test_the_task_word_check_sees_code_and_allows_examples(tmp_path):
    """Guards against a check that cannot fail: a name in code, a comment or a plain docstring is found; one in a
    docstring that says "for example" is not."""
    _write(tmp_path, {"verl/a.py": ('"""The loop. For example search_r1\'s tags.\n\nfor example ``<information>``."""\n'
                                    'FORMAT = "hermes"  # the default\n'
                                    'def f():\n    """Calls the retriever."""\n    # search_r1 only\n')})
    assert task_words(tmp_path) == ['verl/a.py:4: FORMAT = "hermes"  # the default',
                                    'verl/a.py:6: """Calls the retriever."""', "verl/a.py:7: # search_r1 only"]


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


def test_the_checker_finds_upward_arrows_and_circles_through_lazy_and_type_checking_imports(tmp_path):
    """Guards against a checker that sees only top-level imports: issue 58's five-module circle (the search loop's
    formats importing the loop back under ``TYPE_CHECKING``, a reward term importing a format inside a function)
    was invisible to it. A synthetic tree: a circle of plain imports (two workers modules, one through a relative
    import), one closed by a ``TYPE_CHECKING`` import and a lazy one (two trainer modules), one closed by a
    ``TYPE_CHECKING`` import alone (two search_r1 modules), upward arrows through a lazy import and a
    ``TYPE_CHECKING`` one, and a downward import (allowed)."""
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
        "verl/trainer/loop.py": "from ..workers.a import thing\ndef run():\n    from verl.trainer import steps\n",
        "verl/trainer/steps.py": "import typing\nif typing.TYPE_CHECKING:\n    from verl.trainer.loop import run\n",
        "search_r1/__init__.py": "import verl.trainer.loop\n",
        "search_r1/loop.py": "from search_r1.formats import Format\n",
        "search_r1/formats.py": ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                                 "if TYPE_CHECKING:\n    from search_r1.loop import Loop\n"),
    })
    graph = import_graph(tmp_path, ("verl", "search_r1"))
    assert graph["verl.utils.helpers"] == {"verl.trainer.loop", "verl.workers", "verl.workers.a"}
    assert graph["verl.trainer.loop"] == {"verl.workers.a", "verl.trainer", "verl.trainer.steps"}
    assert circles(graph) == [["search_r1.formats", "search_r1.loop"], ["verl.trainer.loop", "verl.trainer.steps"],
                              ["verl.workers.a", "verl.workers.b"]]
    assert layer_violations(graph) == ["verl.utils.helpers -> verl.trainer.loop (utils -> trainer)",
                                       "verl.utils.helpers -> verl.workers (utils -> workers)",
                                       "verl.utils.helpers -> verl.workers.a (utils -> workers)"]
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
