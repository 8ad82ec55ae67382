"""Where a command's CPU goes, by kind of process: ``benchmarks/suite_cpu.py [--out FILE.json] -- make test``.

Runs the command and, every half second until it ends, reads ``/proc``: the user + system CPU time, parent and command
line of every process, and the machine's totals. Prints the CPU seconds of the command's processes (it and its
descendants: this script is their subreaper, so one whose parent died is still counted) per kind of process (a
pytest worker's in-process tests, a ``python -m`` module such as the retrieval service or the trainer, Ray's workers
and daemons, ...) with the number of processes, and how busy the machine was. Other work on the machine is left out.

A process that starts and ends between two samples is missed (its CPU is at most half a second), and one that ends
between samples loses what it used after the last one: the totals are a lower bound, within a few percent for a test
suite whose processes live seconds or longer. Orphans reparented to this script are not reaped until it ends. Linux
only. Exits with the command's status.

Written for issue 58's suite time: which processes a ``make test`` pays for (docs/results.md, "Test suite").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

RAY_DAEMONS = ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py", "agent.py", "runtime_env")


def kind(cmdline: str) -> str:
    """The kind of process a command line is, for grouping."""
    words = cmdline.split()
    if not words:
        return "(no command line)"
    if "exec(eval(sys.stdin.readline()))" in cmdline or "pytest-xdist" in cmdline:
        return "pytest worker (in-process tests)"
    if "default_worker.py" in cmdline or cmdline.startswith("ray::"):
        return "ray worker"
    if any(d in cmdline for d in RAY_DAEMONS) and "ray" in cmdline:
        return "ray daemons"
    if "multiprocessing" in cmdline:
        return "python multiprocessing child"
    if "-m" in words[1:]:
        after = words[words.index("-m", 1) + 1:]
        return f"python -m {after[0] if after else '?'}"
    name = Path(words[0]).name
    if name.startswith("python"):
        return "python -c / script" if len(words) > 1 else "python"
    return "chromium" if "chrom" in name else name


def read_stat(pid: str) -> tuple[int, int] | None:
    """(user + system ticks, parent pid) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return int(fields[11]) + int(fields[12]), int(fields[1])


def cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def machine_ticks() -> list[int]:
    """/proc/stat's first line: user nice system idle iowait irq softirq steal."""
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]


def profile(command: list[str], interval: float = 0.5) -> tuple[int, dict]:
    """Run ``command``, sampling /proc; -> (its exit status, the figures)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to this process
    hz, me = os.sysconf("SC_CLK_TCK"), str(os.getpid())
    before = {pid for pid in os.listdir("/proc") if pid.isdigit()}
    seen: dict[str, dict] = {}
    start_ticks, start = machine_ticks(), time.monotonic()
    child = subprocess.Popen(command)
    while True:
        done = child.poll() is not None
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid in before:
                continue
            stat = read_stat(pid)
            if stat is None:
                continue
            if pid not in seen:
                seen[pid] = {"cmdline": cmdline(pid), "parents": set(), "ticks": 0}
            seen[pid]["ticks"] = stat[0]
            seen[pid]["parents"].add(str(stat[1]))  # a second one: reparented to this script
        if done:
            break
        time.sleep(interval)
    wall = time.monotonic() - start
    total = [b - a for a, b in zip(start_ticks, machine_ticks(), strict=True)]
    ours, grew = {str(child.pid)}, True
    while grew:  # the command's descendants, as far as the samples saw them
        grew = False
        for pid, proc in seen.items():
            if pid not in ours and proc["parents"] & (ours | {me}):
                ours.add(pid)
                grew = True
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for pid in ours:
        proc = seen.get(pid)
        if proc is None:  # the command itself, gone before the first sample
            continue
        name = kind(proc["cmdline"])
        groups[name][0] += 1
        groups[name][1] += proc["ticks"] / hz
    all_ticks = sum(total) or 1
    figures = {"command": command, "status": child.returncode, "wall_s": round(wall, 1), "cpus": os.cpu_count(),
               "machine": {name: round(100 * t / all_ticks, 1)
                           for name, t in zip(("user", "nice", "system", "idle", "iowait"), total, strict=False)},
               "kinds": {name: {"processes": n, "cpu_s": round(cpu, 1)}
                         for name, (n, cpu) in sorted(groups.items(), key=lambda kv: -kv[1][1])}}
    return child.returncode, figures


def report(figures: dict) -> str:
    own = figures["kinds"]
    total = sum(v["cpu_s"] for v in own.values())
    lines = [f"{' '.join(figures['command'])}: exit {figures['status']}, {figures['wall_s'] / 60:.1f} min wall on "
             f"{figures['cpus']} CPUs; machine " + ", ".join(f"{k} {v} %" for k, v in figures["machine"].items()),
             f"{'CPU s':>8} {'share':>6} {'procs':>6}  kind of process"]
    for name, v in own.items():
        lines.append(f"{v['cpu_s']:8.1f} {100 * v['cpu_s'] / max(total, 1e-9):5.1f}% {v['processes']:6d}  {name}")
    lines.append(f"{total:8.1f}  100.0% {sum(v['processes'] for v in own.values()):6d}  the command's own, in all")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --, e.g. benchmarks/suite_cpu.py -- make test")
    status, figures = profile(command)
    print(report(figures), flush=True)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
