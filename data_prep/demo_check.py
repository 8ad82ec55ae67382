"""Check a finished demo run against what the demo reaches: ``python -m data_prep.demo_check RUN_DIR``.

``make demo`` ends with this. It reads the run's ``metrics.jsonl`` (the validation before the first step and the
last one), prints the figures the demo exists to show (test EM, two-hop EM, searches per two-hop question,
before -> after) and a verdict against the ranges of ``configs/demo_expected.yaml``: the spread measured over
the warm-start seeds 0, 1, 2 (docs/results.md, "Demo learning curve"), widened by a margin. Outside a range it
says which figure, names the package versions and CPU numerics in use (the usual cause: a different environment
than the lock's, or numerics not pinned), and exits 1. A run directory without validation records is exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata
from pathlib import Path

import yaml

EXPECTED = Path(__file__).resolve().parent.parent / "configs" / "demo_expected.yaml"
# Figures checked, as the trainer logs them at validation: (metric key, label).
FIGURES = (("val/em", "test EM"), ("val/em/demo_multi", "two-hop EM"),
           ("val/searches/demo_multi", "searches per two-hop question"))
PACKAGES = ("torch", "transformers", "tokenizers", "bm25s", "numpy")


def validations(run_dir: Path) -> list[dict]:
    """The validation records of ``run_dir/metrics.jsonl`` in step order (those holding ``val/em``)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} the directory of a finished demo run?")
    from verl.utils.tracking import read_metrics

    return [r for r in read_metrics(path) if "val/em" in r]


def environment_report(lock: Path) -> str:
    """Versions of the packages the demo's outcome hangs on, whether they are the lock's, and the numerics."""
    locked = {}
    if lock.is_file():
        for line in lock.read_text().splitlines():
            name, sep, version = line.partition("==")
            if sep:
                locked[name.strip().lower()] = version.strip()
    parts = []
    for name in PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "absent"
        mark = "" if locked.get(name) == version else f" (lock: {locked.get(name, 'not listed')})"
        parts.append(f"{name} {version}{mark}")
    import torch

    from data_prep.tiny_policy import demo_numerics_env

    pinned = demo_numerics_env()
    unpinned = [k for k, v in pinned.items() if os.environ.get(k) != v]
    numerics = ("pinned (configs/demo_numerics.env)" if not unpinned
                else f"NOT pinned ({', '.join(unpinned)} unset or different)")
    return (f"packages: {', '.join(parts)}; CPU kernels: {torch.backends.cpu.get_cpu_capability()}; "
            f"numerics: {numerics}")


def check(run_dir: Path, expected: dict[str, list[float]]) -> tuple[list[str], list[str]]:
    """(lines to print, figures outside their range) for the run in ``run_dir``."""
    records = validations(run_dir)
    if not records:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no validation (val/em): the run did not validate")
    before, after = records[0], records[-1]
    lines, outside = [], []
    for key, label in FIGURES:
        low, high = expected[key]
        value = after.get(key, float("nan"))
        ok = low <= value <= high
        lines.append(f"  {label:<31} {before.get(key, float('nan')):.3f} -> {value:.3f}   expected {low:g}-{high:g}"
                     f"{'' if ok else '   OUTSIDE'}")
        if not ok:
            outside.append(label)
    return lines, outside


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_prep.demo_check", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="the demo run's directory (outputs/search_r1/demo_ppo)")
    parser.add_argument("--expected", type=Path, default=EXPECTED, help="ranges (default: %(default)s)")
    args = parser.parse_args(argv)
    expected = yaml.safe_load(args.expected.read_text())
    try:
        lines, outside = check(args.run_dir, expected)
    except (FileNotFoundError, ValueError) as err:
        print(f"[demo check] error: {err}", file=sys.stderr)
        return 2
    print(f"[demo check] {args.run_dir}: before -> after RL (greedy, the 200 test questions)")
    print("\n".join(lines))
    if outside:
        print(f"[demo check] FAILED: {', '.join(outside)} outside what the demo reaches (warm-start seeds 0-2, "
              f"docs/results.md). {environment_report(EXPECTED.parent.parent / 'requirements' / 'lock.txt')}",
              file=sys.stderr)
        return 1
    print("[demo check] OK: RL taught the policy to search, and to search again on two-hop questions, as expected")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
