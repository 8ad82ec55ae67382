"""Progress bars that suit where the output goes: tqdm's bar on a terminal; in a log file or a pipe, one plain line
at most every ``LOG_INTERVAL_S`` seconds (and at the end) instead of a carriage-return redraw per update, which
fills a redirected log with thousands of bar frames."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

LOG_INTERVAL_S = 60.0


class _Lines:
    """A stderr stand-in for tqdm: each redraw becomes one line."""

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text:
            sys.stderr.write(text + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


def progress(*args: Any, **kwargs: Any) -> tqdm:
    """``tqdm(*args, **kwargs)`` on a terminal; plain periodic lines otherwise (see the module docstring)."""
    if not sys.stderr.isatty():
        kwargs = {**kwargs, "file": _Lines(), "mininterval": LOG_INTERVAL_S, "maxinterval": LOG_INTERVAL_S,
                  "ascii": True, "dynamic_ncols": False, "ncols": 100}
    return tqdm(*args, **kwargs)
