"""Search-R1's own prompt, read from the user's Search-R1 checkout (``data_prep.qa_search --template-from-searchr1``).

This project's default prompt (``search_r1.prompts``) follows Search-R1's protocol in its own words; whoever compares
with Search-R1's numbers wants Search-R1's exact prompt. The project does not ship that text: it is read, at the
moment the data is made, from the checkout the user already has, where Search-R1 writes it in
``scripts/data_process/nq_search.py`` as the f-string its function ``make_prefix(dp, template_type)`` assigns to
``prefix`` for ``template_type == 'base'`` (the default of its ``--template_type``).

Choices:

- The file is parsed (``ast``), never imported or executed: it is someone else's script, with imports and a main
  block of its own. The f-string's literal parts become the template's text, and its one formatted value, the
  question (a name assigned ``dp['question']``, or ``dp['question']`` itself), becomes ``{question}``. Any other
  layout (no such file, no ``make_prefix``, no f-string for the ``base`` type, another formatted value) is a
  ``TemplateSourceError`` saying what was expected and where.
- What was read is recorded: the template, the file's absolute path and its SHA-256 (``SearchR1Template``), which
  ``qa_search`` writes into ``prompt.json`` beside the parquet, so a run's data names the exact source it took.
- The question itself is put in by ``search_r1.prompts.make_prompt``: stripped and given a final ``?``, as
  Search-R1's ``process_fn`` does before calling ``make_prefix``.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

from search_r1.prompts import PLACEHOLDER

SCRIPT = Path("scripts/data_process/nq_search.py")  # where Search-R1 keeps make_prefix, inside its checkout
FUNCTION = "make_prefix"
TEMPLATE_TYPE = "base"  # Search-R1's --template_type default, and its only type


class TemplateSourceError(ValueError):
    """The checkout does not hold ``make_prefix`` as Search-R1 lays it out; the message says what was expected."""


@dataclass(frozen=True)
class SearchR1Template:
    """The template read from a checkout and where it came from."""

    template: str  # with the {question} placeholder (search_r1.prompts.make_prompt fills it)
    path: str  # the absolute path of the file read
    sha256: str  # of that file's bytes

    def record(self) -> dict:
        """What ``prompt.json`` holds about it."""
        return {"template": self.template, "source": f"Search-R1's {FUNCTION} (template_type {TEMPLATE_TYPE!r})",
                "path": self.path, "sha256": self.sha256}


def read_searchr1_template(checkout: str | Path) -> SearchR1Template:
    """Search-R1's prompt template from the checkout ``checkout`` (see the module docstring);
    ``TemplateSourceError`` naming the path and what was expected when its layout differs."""
    root = Path(checkout)
    if not root.is_dir():
        raise TemplateSourceError(f"--template-from-searchr1 {checkout}: no such directory (expected a checkout of "
                                  f"Search-R1, holding {SCRIPT})")
    path = (root / SCRIPT).resolve()
    if not path.is_file():
        raise TemplateSourceError(f"--template-from-searchr1 {checkout}: no {SCRIPT} in it (expected a checkout of "
                                  f"Search-R1, whose {SCRIPT} defines {FUNCTION})")
    data = path.read_bytes()
    where = f"{path}"
    try:
        tree = ast.parse(data, filename=str(path))
    except (SyntaxError, ValueError) as err:
        raise TemplateSourceError(f"{where} does not parse as Python ({err}); expected Search-R1's {SCRIPT}") from None
    function = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == FUNCTION), None)
    if function is None or not function.args.args:
        raise TemplateSourceError(f"{where} defines no function {FUNCTION}(dp, template_type) at its top level "
                                  "(expected the function that returns Search-R1's prompt)")
    text = _template_of(function, where)
    if PLACEHOLDER not in text:
        raise TemplateSourceError(f"{where}: {FUNCTION}'s prompt never formats the question (expected "
                                  f"f\"...{{question}}...\")")
    return SearchR1Template(text, str(path), hashlib.sha256(data).hexdigest())


def _template_of(function: ast.FunctionDef, where: str) -> str:
    """The f-string ``function`` assigns to ``prefix`` for the ``base`` template type, as a template."""
    param = function.args.args[0].arg  # dp: the row, whose 'question' the prompt holds
    question_names = {target.id for node in ast.walk(function) if isinstance(node, ast.Assign)
                      and _is_question(node.value, param, set()) for target in node.targets
                      if isinstance(target, ast.Name)}
    candidates = _prefix_assignments(function.body, None)
    chosen = [value for kind, value in candidates if kind in (TEMPLATE_TYPE, None)]
    if len(chosen) != 1:
        kinds = sorted({kind for kind, _ in candidates if kind is not None})
        raise TemplateSourceError(
            f"{where}: expected {FUNCTION} to assign one f-string to prefix for template_type == {TEMPLATE_TYPE!r}; "
            f"found {len(chosen)}" + (f" (template types: {', '.join(kinds)})" if kinds else ""))
    value = chosen[0]
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    if not isinstance(value, ast.JoinedStr):
        raise TemplateSourceError(f"{where}: {FUNCTION} assigns prefix a {type(value).__name__}, expected an f-string")
    parts = []
    for part in value.values:
        if isinstance(part, ast.Constant):
            parts.append(str(part.value))
        elif (isinstance(part, ast.FormattedValue) and part.conversion == -1 and part.format_spec is None
              and _is_question(part.value, param, question_names)):
            parts.append(PLACEHOLDER)
        else:
            raise TemplateSourceError(f"{where}: {FUNCTION}'s f-string formats {ast.unparse(part)}, expected only the "
                                      f"question ({{question}}, from {param}['question'])")
    return "".join(parts)


def _is_question(node: ast.expr, param: str, names: set[str]) -> bool:
    """``node`` is the row's question: ``<param>['question']`` or a name assigned it."""
    if isinstance(node, ast.Name):
        return node.id in names
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == param
            and isinstance(node.slice, ast.Constant) and node.slice.value == "question")


def _prefix_assignments(body: list[ast.stmt], kind: str | None) -> list[tuple[str | None, ast.expr]]:
    """(template type of the branch or None, value) of every ``prefix = ...`` in ``body``, branches of
    ``if template_type == '<type>'`` tagged with their type."""
    found: list[tuple[str | None, ast.expr]] = []
    for node in body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "prefix" for t in node.targets):
            found.append((kind, node.value))
        elif isinstance(node, ast.If):
            test = node.test
            branch = (test.comparators[0].value if isinstance(test, ast.Compare) and len(test.ops) == 1
                      and isinstance(test.ops[0], ast.Eq) and isinstance(test.left, ast.Name)
                      and test.left.id == "template_type" and isinstance(test.comparators[0], ast.Constant) else None)
            found += _prefix_assignments(node.body, branch if branch is not None else kind)
            found += _prefix_assignments(node.orelse, f"not {branch}" if branch is not None else kind)
    return found
