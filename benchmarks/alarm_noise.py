"""How often the valid-action alarm warns on noise, and how soon it catches a real fall (simulated runs).

    python benchmarks/alarm_noise.py [--runs 2000] [--steps 30] [--turns 24] [--seed 0]

Each simulated run is ``--steps`` steps of ``--turns`` turns, each turn well-formed with a fixed probability (no
fall: every warning is a false alarm), or with the probability falling at step 6 (a real fall: the step it is
first caught). The steps go through the trainer's own ``HealthMonitor`` at the default settings, under two rules
side by side: the current one (``verl.trainer.alarms.ShareFall``: the turns since the start, at most a window's,
pooled against the start's, beyond sampling noise) and the earlier one (one step's share against 0.8 x the mean of
the first 3, ``RelativeFall``). Prints, per case and rule, the share of runs that warned and the mean step of the
first warning.
No model, no service: pure arithmetic on binomial draws, about 20-40 s here at the defaults.
"""

from __future__ import annotations

import argparse
import logging
import random
import tempfile

from verl.config import TrainerConfig
from verl.trainer.alarms import RelativeFall, ShareFall, not_answered
from verl.trainer.health import HealthMonitor

CASES = [  # (label, share before step 6, share from step 6 on)
    ("no fall, 7 %", 0.07, 0.07), ("no fall, 30 %", 0.3, 0.3), ("no fall, 60 %", 0.6, 0.6),
    ("no fall, 95 %", 0.95, 0.95), ("fall 95 % -> 60 %", 0.95, 0.6), ("fall 50 % -> 20 %", 0.5, 0.2),
    ("fall 7 % -> 0", 0.07, 0.0),
]


def monitor(rule: str, cfg: TrainerConfig, out: str) -> HealthMonitor:
    """The trainer's monitor, its valid-action alarm replaced by the earlier rule for ``rule == "one step"``."""
    health = HealthMonitor(cfg, out)
    if rule == "one step":
        health.alarms = [RelativeFall("valid_actions_falling", "agent/valid_action_ratio",
                                      cfg.alarm_valid_action_fraction, cfg.alarm_baseline_steps, "", "", not_answered)
                         if isinstance(a, ShareFall) else a for a in health.alarms]
    return health


def first_warning(rule: str, before: float, after: float, args, rng: random.Random, out: str) -> int | None:
    health = monitor(rule, TrainerConfig(), out)
    for step in range(1, args.steps + 1):
        share = before if step < 6 else after
        valid = sum(rng.random() < share for _ in range(args.turns))
        flags = health.observe(step, {"agent/valid_action_ratio": valid / args.turns,
                                      "agent/turns": float(args.turns)}, [])
        if flags.get("health/valid_actions_falling"):
            return step
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("verl.trainer.health").setLevel(logging.ERROR)  # the warnings themselves: thousands
    print(f"{args.runs} runs of {args.steps} steps x {args.turns} turns per case; the fall (where any) at step 6")
    print(f"{'case':<20} {'rule':<14} {'runs warned':>11} {'first warning (mean step)':>26}")
    with tempfile.TemporaryDirectory() as out:
        for label, before, after in CASES:
            for rule in ("pooled", "one step"):
                rng = random.Random(args.seed)
                firsts = [first_warning(rule, before, after, args, rng, out) for _ in range(args.runs)]
                warned = [s for s in firsts if s is not None]
                mean = f"{sum(warned) / len(warned):.1f}" if warned else "-"
                print(f"{label:<20} {rule:<14} {len(warned) / args.runs:>11.1%} {mean:>26}")


if __name__ == "__main__":
    main()
