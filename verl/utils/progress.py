"""Progress bars that suit where the output goes: tqdm's bar on a terminal; in a log file or a pipe, one plain line
at most every ``LOG_INTERVAL_S`` seconds plus the last state when the bar closes, instead of a carriage-return
redraw per update (and per ``set_postfix``), which fills a redirected log with thousands of bar frames."""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm

LOG_INTERVAL_S = 60.0


class _Lines:
    """A stderr stand-in for tqdm: the first frame, then at most one frame per ``LOG_INTERVAL_S``, each as a line,
    and the last frame when tqdm ends the bar with a newline."""

    def __init__(self) -> None:
        self.last_emit = -LOG_INTERVAL_S
        self.pending = ""

    def write(self, text: str) -> None:
        frame = text.replace("\r", "").strip()
        if frame:
            self.pending = frame
            if time.monotonic() - self.last_emit >= LOG_INTERVAL_S:
                self._emit()
        elif "\n" in text and self.pending:
            self._emit()

    def _emit(self) -> None:
        sys.stderr.write(self.pending + "\n")
        self.pending, self.last_emit = "", time.monotonic()

    def flush(self) -> None:
        sys.stderr.flush()


def progress(*args: Any, **kwargs: Any) -> tqdm:
    """``tqdm(*args, **kwargs)`` on a terminal; plain periodic lines otherwise (see the module docstring)."""
    if not sys.stderr.isatty():
        kwargs = {**kwargs, "file": _Lines(), "mininterval": LOG_INTERVAL_S, "ascii": True, "ncols": 100}
    return tqdm(*args, **kwargs)
