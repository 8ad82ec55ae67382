"""How long a misspelt config key takes to be refused, from a fresh process (issue 57's item 7: target under 3 s).

    python benchmarks/bench_config_error.py [--runs 5] [--code DIR]

Runs ``python -m verl.trainer.main_ppo actor_rollout_ref.actor.optim.lrr=1e-6`` (and ``main_sft optim.lrr=1e-5``)
``--runs`` times each, every run a new interpreter, and prints the exit status, the wall time of each run and their
median, and the message's first 100 characters. ``--code DIR`` runs another checkout (e.g. a ``git worktree`` of an
older commit) for a before/after figure; its own tree is put first on the path. Run it on an idle machine for a
figure: the time is mostly the interpreter's imports, which a loaded machine slows several times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {"main_ppo": ["-m", "verl.trainer.main_ppo", "actor_rollout_ref.actor.optim.lrr=1e-6"],
            "main_sft": ["-m", "verl.trainer.main_sft", "optim.lrr=1e-5"]}


def time_refusal(args: list[str], code: Path) -> tuple[float, int, str]:
    """(wall seconds, exit status, first line of stderr) of one fresh ``python args`` run in ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=code, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, done.returncode, (done.stderr.strip().splitlines() or [""])[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per command")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout to run (default: this one)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, code {args.code}")
    for name, command in COMMANDS.items():
        runs = [time_refusal(command, args.code) for _ in range(args.runs)]
        times = [t for t, _, _ in runs]
        print(f"{name}: exit {sorted({rc for _, rc, _ in runs})}, median {statistics.median(times):.2f} s "
              f"(runs {', '.join(f'{t:.2f}' for t in times)}): {runs[0][2][:100]}")


if __name__ == "__main__":
    main()
