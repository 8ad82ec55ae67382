"""Helpers of the viewer's tests: run ``search-r1-inspect`` and read its page as a DOM (``page_dom``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.search_r1.inspect.page_dom import Element, parse

ROOT = Path(__file__).resolve().parents[3]
INSPECT = [sys.executable, "-m", "search_r1.inspect"]


def inspect(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """``search-r1-inspect args`` (as ``python -m search_r1.inspect``)."""
    return subprocess.run([*INSPECT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def read_page(path: Path) -> Element:
    return parse(path.read_bytes().decode("utf-8"))  # bytes: no \r read as \n


def page_of(tmp_path: Path, *args: str) -> Element:
    """The page ``search-r1-inspect args`` writes (it must exit 0)."""
    out = tmp_path / "page.html"
    done = inspect(*args, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return read_page(out)


def articles(dom: Element) -> dict[tuple[str, str, str], Element]:
    """The page's trajectories by (split, step, uid)."""
    found = {(a.attrs["data-split"], a.attrs["data-step"], a.attrs["data-uid"]): a for a in dom.by_class("trajectory")}
    assert len(found) == len(dom.by_class("trajectory")), "two trajectories of the page share split, step and uid"
    return found


def option_counts(dom: Element, select_id: str) -> dict[str, int]:
    """{option value: the count its label shows} of a filter (``all`` under "")."""
    out = {}
    for option in dom.by_id(select_id).find_all(lambda e: e.tag == "option"):
        out[option.attrs["value"]] = int(option.text.rsplit("(", 1)[1].rstrip(")"))
    return out


def no_display_env() -> dict[str, str]:
    """This environment without a display (as on a server reached over ssh), on a wide terminal."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    return {**env, "COLUMNS": "400", "TERM": "dumb"}
