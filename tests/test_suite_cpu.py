"""benchmarks/suite_cpu.py: a command's CPU by kind of process, its own processes only.

Guards against a profile that counts other work on the machine as the command's (a job started beside it), misses
the command's orphans (a daemon whose parent exited), or hides the command's exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BURN = "import time; t = time.process_time(); exec('while time.process_time() - t < 1.2: pass')"
BURN_LONGER = BURN.replace("1.2", "3.0")
# the command: a `python -m` child that burns 1.2 CPU-s, a double-forked orphan that burns as much, then exit 3
COMMAND = f"""
import os, subprocess, sys, time
subprocess.run([sys.executable, "-m", "timeit", "-n", "1", "-r", "1", {BURN!r}])
if os.fork() == 0:  # the orphan: its parent exits at once, it runs on
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", {BURN!r} + "  # orphan"])
    os._exit(0)
os.wait()
time.sleep(1.5)
sys.exit(3)
"""


def test_the_commands_own_processes_by_kind_and_its_exit_status(tmp_path):
    out = tmp_path / "figures.json"
    # other work, started once the profile runs (a process that was there before is left out on that ground alone)
    beside = subprocess.Popen(["bash", "-c", f'sleep 0.5; "{sys.executable}" -c "{BURN_LONGER}"; true'])  # no exec
    try:
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite_cpu.py"), "--out", str(out), "--",
                               sys.executable, "-c", COMMAND], capture_output=True, text=True, timeout=120)
    finally:
        beside.wait(timeout=60)
    assert done.returncode == 3, done.stderr
    kinds = json.loads(out.read_text())["kinds"]
    assert kinds["python -m timeit"]["processes"] == 1 and kinds["python -m timeit"]["cpu_s"] >= 0.6
    # the command and the orphan (its short-lived parent may fall between two samples), not the process beside it:
    # the orphan's 1.2 s are counted (less up to a sample's interval), the 3 s beside are not
    assert kinds["python -c / script"]["processes"] in (2, 3), kinds
    assert 0.6 <= kinds["python -c / script"]["cpu_s"] < 2.0, kinds
    assert "the command's own, in all" in done.stdout and "python -m timeit" in done.stdout
