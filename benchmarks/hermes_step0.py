"""Which action format an instruct model follows before any training: the share of trajectories with a well-formed
call, tag format vs hermes (issue 41's acceptance figure).

    python benchmarks/hermes_step0.py --model data/models/smollm2-135m-instruct --data data/demo/test.parquet \\
        --retriever-url http://127.0.0.1:8021 --limit 60 --out /tmp/hermes_step0 [--n 4] [--config FILE] \\
        [key=value ...]

Runs ``search_r1.evaluate`` (greedy, or ``--n`` samples per question) twice on the same questions: as they are
(the tag format, Search-R1's instruction) and made again under ``search_r1.prompts.HERMES_TEMPLATE`` with
``actor_rollout_ref.rollout.multi_turn.format=hermes`` (the search tool's schema in the chat template). Prints, per
format: trajectories with at least one well-formed search (tags: a ``<search>`` answered with passages; hermes: a
``search`` tool call that ran), with any malformed call, answered (``<answer>`` written), EM. Overrides after the
options go to both evaluations (e.g. the lengths of scripts/demo_real.sh); the hermes prompt is longer (the tool
schemas), so keep ``data.max_start_length`` above it (the loop warns when it cuts prompts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_prep.retemplate import retemplate_parquet  # noqa: E402


def figures(out: Path) -> dict[str, float]:
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    n = len(records)
    return {"n": n, "well_formed_search": sum(r["searches"] > 0 for r in records) / n,
            "malformed_call": sum(r["invalid_calls"] > 0 for r in records) / n,
            "invalid_turn": sum(r["invalid"] > 0 for r in records) / n,
            "answered": sum(r["stop_reason"] == "answered" for r in records) / n,
            "em": sum(r["em"] for r in records) / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--retriever-url", required=True)
    p.add_argument("--limit", type=int, default=60)
    p.add_argument("--n", type=int, default=1, help="trajectories per question (sampled at --temperature when > 1)")
    p.add_argument("--temperature", type=float, default=None, help="evaluate's default: 0 with --n 1, else 1.0")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--config", action="append", default=[], help="YAML layered under the overrides (as evaluate's)")
    p.add_argument("--formats", nargs="+", default=["search_r1", "hermes"], choices=["search_r1", "hermes"])
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {"search_r1": (args.data, []),
            "hermes": (retemplate_parquet(args.data, args.out / "hermes.parquet", "hermes"),
                       ["actor_rollout_ref.rollout.multi_turn.format=hermes"])}
    results = {}
    for name, (data, extra) in ((name, runs[name]) for name in args.formats):
        out = args.out / name
        cmd = [sys.executable, "-m", "search_r1.evaluate", "--model", args.model, "--data", str(data),
               "--retriever-url", args.retriever_url, "--limit", str(args.limit), "--out", str(out),
               "--n", str(args.n), *(["--temperature", str(args.temperature)] if args.temperature is not None else []),
               *[a for c in args.config for a in ("--config", c)], *args.overrides,
               *extra]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        results[name] = figures(out)
        print(name, json.dumps(results[name]), flush=True)
    (args.out / "summary.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
