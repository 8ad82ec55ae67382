"""Step-time breakdown of PPO on the tiny policy, for vLLM and HF rollout (figures, not pass/fail).

Runs a few real training steps through the same entry point as train_ppo.sh (search agent loop,
reward, log-probs, reference, values, GAE, critic and actor updates, weight sync) and prints,
per engine, the mean seconds of each phase over the measured steps (the first step is a warm-up
and is excluded), the overhead (step time not spent in a named phase), and tokens/s.

    python benchmarks/bench_ppo_step.py [--steps 4] [--engines vllm,hf] [key=value ...]

Needs the demo data and tiny policy (run `make demo` or train_ppo.sh once) and, unless
do_search=false is passed, the retrieval service on retriever.url.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

import numpy as np

from verl.config import load_config
from verl.trainer.main_ppo import build_trainer
from verl.utils.tracking import read_metrics

PHASES = ["gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "sync"]


def run(engine: str, steps: int, overrides: list[str]) -> dict[str, float]:
    out = tempfile.mkdtemp(prefix=f"bench_ppo_{engine}_")
    cfg = load_config([
        f"actor_rollout_ref.rollout.name={engine}", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.resume_mode=disable", "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}",
        "actor_rollout_ref.actor.use_kl_loss=true", *overrides,
    ])
    trainer = build_trainer(cfg)
    trainer.fit()
    records = read_metrics(Path(out) / "metrics.jsonl")[1:]  # drop the warm-up step
    mean = lambda key: float(np.mean([r.get(key, 0.0) for r in records]))  # noqa: E731
    row = {phase: mean(f"timing/{phase}") for phase in PHASES}
    row["step"] = mean("timing/step")
    row["overhead"] = row["step"] - sum(row[p] for p in PHASES)
    row["gen_tokens_per_s"] = mean("perf/gen_tokens_per_s")
    row["tokens_per_s"] = mean("perf/tokens_per_s")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--engines", default="vllm,hf")
    args, overrides = parser.parse_known_args()
    logging.basicConfig(level=logging.WARNING)
    results = {engine: run(engine, args.steps, overrides) for engine in args.engines.split(",")}
    print(f"\nmean seconds per step over steps 2..{args.steps} (step 1 is warm-up)")
    print(f"{'phase':<18}" + "".join(f"{e:>12}" for e in results))
    for key in [*PHASES, "overhead", "step"]:
        print(f"{key:<18}" + "".join(f"{r[key]:>12.3f}" for r in results.values()))
    for key in ("gen_tokens_per_s", "tokens_per_s"):
        print(f"{key:<18}" + "".join(f"{r[key]:>12.1f}" for r in results.values()))
    for e, r in results.items():
        print(f"{e}: overhead = {100 * r['overhead'] / r['step']:.1f}% of the step")
    if "vllm" in results and "hf" in results:
        ratio = results["vllm"]["gen_tokens_per_s"] / results["hf"]["gen_tokens_per_s"]
        print(f"vLLM / HF rollout tokens/s = {ratio:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
