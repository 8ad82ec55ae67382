"""Guards against a progress bar filling a redirected log: a bar updated (and given a postfix) on every one of
500 steps writes its first frame, its last frame and nothing in between when the output is not a terminal."""

from __future__ import annotations

import subprocess
import sys

CODE = """
from verl.utils.progress import progress
bar = progress(range(500), desc="warm start", unit="step")
for i in bar:
    bar.set_postfix(loss=1.0 / (i + 1))
"""


def test_a_bar_in_a_pipe_writes_its_first_and_last_frames_only():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=True)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, done.stderr[-2000:]
    assert lines[0].startswith("warm start:   0%") and lines[1].startswith("warm start: 100%") and "500/500" in lines[1]
