"""Step-time breakdown of PPO per rollout engine and world size (figures, not pass/fail).

Runs a few real training steps of ``python -m verl.trainer.main_ppo`` (search agent loop, reward,
log-probs, reference, values, GAE, critic and actor updates, weight sync into every rank's engine),
one fresh process per configuration, and prints per configuration the mean seconds of each phase
over the measured steps (the first step is a warm-up and is excluded), the overhead (step time not
spent in a named phase), generated tokens/s (in all and per rollout rank), and the weight sync:
seconds, its share of the step, bytes handed to each engine, bytes each rank gathered from the
others, and bytes that passed through the driver, next to what the previous design (rank 0 gathers
the full float32 state dict and ships it through Ray to an engine in the driver) moved per sync.

    python benchmarks/bench_ppo_step.py [--steps 4] [--engines hf,vllm] [--worlds 1,2]
                                        [--hidden-size 512 --layers 4] [key=value ...]

World 1 is ``trainer.backend=local`` (everything in one process, torch's default threads); world N
is ``trainer.backend=ray trainer.n_gpus_per_node=N`` (N rank processes, each with its own engine;
Ray gives each 1 thread on this CPU). ``--hidden-size``/``--layers`` replace the policy by a randomly
initialised Qwen2 model of that size with the policy's tokenizer (heads = hidden / 64), e.g. the
hidden-512 / 4-layer model of the issue's goal; random weights rarely stop early, so every row
samples close to its full budget. Needs the demo data and tiny policy (``make demo`` once) and,
unless ``do_search=false`` is passed, the retrieval service on ``retriever.url``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data_prep.tiny_model import build_model  # noqa: E402
from verl.utils.tracking import read_metrics  # noqa: E402

PHASES = ["gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "sync"]
DEFAULT_POLICY = ROOT / "data/demo/tiny_policy"


def resized_policy(policy: Path, hidden: int, layers: int, out: Path) -> Path:
    """A random Qwen2 model of ``hidden`` x ``layers`` with ``policy``'s tokenizer, saved to ``out``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = build_model(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=hidden // 64,
                        intermediate_size=4 * hidden)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def run(engine: str, world: int, steps: int, overrides: list[str], out: Path) -> dict[str, float]:
    """Train ``steps`` steps in a fresh process; mean figures of steps 2.. from its metrics.jsonl."""
    ranks = ["trainer.backend=local"] if world == 1 else ["trainer.backend=ray", f"trainer.n_gpus_per_node={world}"]
    args = [f"actor_rollout_ref.rollout.name={engine}", f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.resume_mode=disable", "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}",
            "actor_rollout_ref.actor.use_kl_loss=true", *ranks, *overrides]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOGLEVEL": "WARNING"}
    done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--config", "configs/demo.yaml", *args],
                          cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{engine} world {world} failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    records = read_metrics(out / "metrics.jsonl")[1:]  # drop the warm-up step
    mean = lambda key: float(np.mean([r.get(key, 0.0) for r in records]))  # noqa: E731
    row = {phase: mean(f"timing/{phase}") for phase in PHASES}
    row["step"] = mean("timing/step")
    row["overhead"] = row["step"] - sum(row[p] for p in PHASES)
    for key in ("perf/gen_tokens_per_s", "perf/rollout_ranks", "perf/sync_bytes_driver", "perf/sync_bytes_engine",
                "perf/sync_bytes_gathered"):
        row[key.removeprefix("perf/")] = mean(key)
    row["gen_tokens_per_s_per_rank"] = row["gen_tokens_per_s"] / max(row["rollout_ranks"], 1)
    return row


def fp32_state_bytes(model_dir: Path) -> int:
    """Bytes of the policy's full float32 state dict (what the previous design shipped to the driver)."""
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    return sum(t.numel() * 4 for t in state.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--worlds", default="1,2", help="comma-separated world sizes (1 = local backend)")
    parser.add_argument("--hidden-size", type=int, default=0, help="random policy of this width (0 = the demo policy)")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random policy")
    args, overrides = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy = DEFAULT_POLICY
        for item in overrides:
            if item.startswith("actor_rollout_ref.model.path="):
                policy = Path(item.split("=", 1)[1])
        if args.hidden_size:
            policy = resized_policy(policy, args.hidden_size, args.layers, Path(tmp) / "policy")
            overrides = [*overrides, f"actor_rollout_ref.model.path={policy}"]
        results = {}
        for world in (int(w) for w in args.worlds.split(",")):
            for engine in args.engines.split(","):
                name = f"{engine}/w{world}"
                results[name] = run(engine, world, args.steps, overrides, Path(tmp) / name.replace("/", "_"))
                print(f"{name}: step {results[name]['step']:.2f} s", flush=True)
        old_bytes = fp32_state_bytes(policy)
    print(f"\npolicy {policy.name if not args.hidden_size else f'random {args.hidden_size}x{args.layers}'}; "
          f"mean seconds per step over steps 2..{args.steps} (step 1 is warm-up)")
    print(f"{'phase':<26}" + "".join(f"{name:>12}" for name in results))
    for key in [*PHASES, "overhead", "step"]:
        print(f"{key:<26}" + "".join(f"{r[key]:>12.3f}" for r in results.values()))
    for key in ("gen_tokens_per_s", "gen_tokens_per_s_per_rank", "rollout_ranks"):
        print(f"{key:<26}" + "".join(f"{r[key]:>12.1f}" for r in results.values()))
    print(f"{'sync share of step (%)':<26}" + "".join(f"{100 * r['sync'] / r['step']:>12.1f}"
                                                       for r in results.values()))
    for key in ("sync_bytes_engine", "sync_bytes_gathered", "sync_bytes_driver"):
        print(f"{key + ' (MB)':<26}" + "".join(f"{r[key] / 1e6:>12.2f}" for r in results.values()))
    print(f"previous design, per sync: {old_bytes / 1e6:.2f} MB of float32 weights through the driver "
          "(plus rank 0's gather), now 0")
    for world in sorted({name.split("/w")[1] for name in results}):
        if f"vllm/w{world}" in results and f"hf/w{world}" in results:
            vllm, hf = results[f"vllm/w{world}"], results[f"hf/w{world}"]
            ratio = vllm["gen_tokens_per_s"] / hf["gen_tokens_per_s"]
            print(f"world {world}: vLLM / HF generated tokens/s = {ratio:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
