"""The user-facing documents stay lean, and the sections the code cites by name exist.

- README.md: at most ``README_WORDS`` words (as ``wc -w`` counts them), its first screen the two commands.
- docs/results.md: the current figures only, at most ``RESULTS_WORDS`` words; the journal it grew from lives in
  docs/history/, linked, and every journal section it names is there.
- A citation ``docs/results.md, "Section"`` or ``docs/design.md, "Section"`` in the code, scripts, configs or the
  other documents names a heading of that document (a heading that starts with the name, as in "Memory over a run"
  for "Memory over a run: ...").
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_WORDS = 1500
RESULTS_WORDS = 6000
FIRST_SCREEN_LINES = 20
JOURNAL = ROOT / "docs" / "history" / "results-journal.md"
CITING = (".py", ".sh", ".yaml", ".env", ".md")
SKIP_DIRS = {".venv", ".git", "outputs", "data", "history"}


def words(path: Path) -> int:
    """Words as ``wc -w`` counts them: runs of non-space characters."""
    return len(path.read_text().split())


def headings(path: Path) -> list[str]:
    """The titles of a Markdown file's headings, backticks dropped."""
    return [line.lstrip("#").strip().replace("`", "") for line in path.read_text().splitlines()
            if line.startswith("#")]


def citations(doc: str, files: list[Path]) -> dict[str, list[str]]:
    """Section name -> the files that cite ``docs/<doc>``'s section by that quoted name."""
    pattern = re.compile(rf'{re.escape(doc)}`?\)?,\s*(?:#\s*)?"([^"]+)"')
    found: dict[str, list[str]] = {}
    for path in files:
        for name in pattern.findall(path.read_text(errors="replace")):
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            name = re.sub(r"\n\s*#", " ", name).replace("`", "")  # a name wrapped over comment lines
            found.setdefault(" ".join(name.split()), []).append(str(where))
    return found


def missing_sections(doc: Path, cited: dict[str, list[str]]) -> list[str]:
    titles = headings(doc)
    return [f"{name!r} (cited by {', '.join(sorted(set(by)))})" for name, by in sorted(cited.items())
            if not any(title.startswith(name) for title in titles)]


@pytest.fixture(scope="module")
def citing_files() -> list[Path]:
    """The repository's own files (``git ls-files``: not a build directory, a virtual environment or outputs)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    return [p for p in sorted(paths) if p.suffix in CITING and p.is_file() and p != Path(__file__)
            and not SKIP_DIRS & set(p.relative_to(ROOT).parts)]


def test_readme_is_short_and_its_first_screen_is_the_two_commands():
    """Guards against the README growing back into a lab notebook (2,950 words before issue 58, its second
    paragraph 20 lines of variants, times, disk and GPU notes)."""
    assert words(ROOT / "README.md") <= README_WORDS
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN_LINES])
    assert re.search(r"^make demo\b", first_screen, re.M) and re.search(r"^make test\b", first_screen, re.M)


def test_results_hold_the_current_figures_and_link_the_journal():
    """Guards against docs/results.md growing back into the journal (30,324 words before issue 58, two dozen
    suite-timing rows), and against a section it sends the reader to in the journal being renamed away."""
    results = ROOT / "docs" / "results.md"
    assert words(results) <= RESULTS_WORDS
    text = results.read_text()
    assert "history/results-journal.md" in text and JOURNAL.is_file()
    named = re.findall(r'Journal: ((?:"[^"]+"(?:,| and)?\s*)+)', text)
    sections = [" ".join(s.replace("`", "").split()) for group in named for s in re.findall(r'"([^"]+)"', group)]
    assert sections, "results.md names no journal section"
    journal = headings(JOURNAL)
    lost = [s for s in sections if not any(title.startswith(s) for title in journal)]
    assert not lost, lost


@pytest.mark.parametrize("doc", ["results.md", "design.md"])
def test_sections_the_code_cites_exist(doc, citing_files):
    """Guards against a citation that leads nowhere: ``process_memory`` cited docs/results.md, "Memory over a long
    run", which no heading had; docs/design.md cited "Online search backends (issue 41)" of results.md."""
    cited = citations(doc, citing_files)
    assert cited, f"no citation of {doc} found: the pattern is broken"
    missing = missing_sections(ROOT / "docs" / doc, cited)
    assert not missing, "\n".join(missing)


def test_the_citation_check_can_fail(tmp_path):
    """Guards against a check that passes whatever the citations say."""
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\n## Memory over a run: each step\n")
    code = tmp_path / "code.py"
    code.write_text('x = 1  # docs/doc.md, "Memory over a run"\n# (docs/doc.md, "Memory over a\n# long run")\n')
    cited = citations("doc.md", [code])
    assert sorted(cited) == ["Memory over a long run", "Memory over a run"]
    assert missing_sections(doc, {k: ["code.py"] for k in cited}) == ["'Memory over a long run' (cited by code.py)"]
