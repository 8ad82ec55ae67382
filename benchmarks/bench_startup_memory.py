"""The trainer's start-up memory estimate (at the data's lengths, and the bound) against the run's measured peak.

    python benchmarks/bench_startup_memory.py --model DIR [--data DIR] [--steps 2] [key=value ...]

Serves the demo knowledge base (``--data``, default ``data/demo``: its ``corpus.jsonl``, ``train.parquet`` and
``test.parquet``, from ``python -m data_prep.demo_kb --out data/demo``) from a BM25 index built into a temporary
directory, runs ``--steps`` GRPO steps of ``make demo-real``'s sizes (6 prompts x 4 samples, micro-batches of 4,
bfloat16) with Search-R1's lengths (``data.max_prompt_length=4096``, ``max_start_length=2048``,
``max_response_length=500``, ``max_obs_length=500``; the trailing ``key=value`` overrides replace any of these) on
the CPU, and prints the start-up summary's memory line, each step's own peak resident set
(``perf/step_max_rss_gb``) and its estimate at its longest row (``perf/memory_estimate_gb``), and the longest
response of each step. ``--estimate-only`` prints the start-up line alone, computed in this process by the
trainer's own functions (``expected_row_lengths``, ``MemoryMeter.report``) without training. The figures of issue 57
(docs/results.md) came from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from retrieval_server.index.build import build_index  # noqa: E402
from retrieval_server.launcher import ServerProcess  # noqa: E402
from verl.utils.tracking import read_metrics  # noqa: E402

SIZES = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.n=4",
         "data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=24",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
         "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
         "actor_rollout_ref.actor.optim.lr=1e-5"]
SEARCH_R1_LENGTHS = ["data.max_prompt_length=4096", "data.max_start_length=2048", "data.max_response_length=500",
                     "data.max_obs_length=500", "max_turns=2"]


def startup_line(model: Path, data: Path, url: str, overrides: list[str]) -> str:
    """The start-up summary's memory line for the run, made here by the trainer's functions."""
    from transformers import AutoTokenizer

    from verl.config import load_config
    from verl.trainer.recipe import expected_row_lengths
    from verl.utils.dataset import PromptDataset
    from verl.workers.memory import MemoryMeter

    cfg = load_config([f"actor_rollout_ref.model.path={model}", f"data.train_files={data / 'train.parquet'}",
                       f"data.val_files={data / 'test.parquet'}", f"retriever.url={url}", *SIZES, *SEARCH_R1_LENGTHS,
                       "trainer.device=cpu", *overrides])
    tokenizer = AutoTokenizer.from_pretrained(model)
    meter = MemoryMeter(cfg)
    meter.report(expected_row_lengths(cfg, tokenizer, PromptDataset(cfg.data.train_files, tokenizer,
                                                                     cfg.data.max_prompt_length)))
    return f"{meter.summary()} ({meter.lengths.source})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the policy, a Hugging Face model directory")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "demo", help="the demo knowledge base")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--estimate-only", action="store_true", help="print the start-up memory line, train nothing")
    args, overrides = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        build_index(args.data / "corpus.jsonl", Path(tmp) / "index", retriever="bm25", progress=False)
        with ServerProcess(Path(tmp) / "index", args.data / "corpus.jsonl") as server:
            server.wait_ready()
            if args.estimate_only:
                print(startup_line(args.model, args.data, server.url, overrides))
                return
            out = Path(tmp) / "run"
            command = [sys.executable, "-m", "verl.trainer.main_ppo", f"actor_rollout_ref.model.path={args.model}",
                       f"data.train_files={args.data / 'train.parquet'}",
                       f"data.val_files={args.data / 'test.parquet'}",
                       "actor_rollout_ref.rollout.name=hf", f"retriever.url={server.url}", *SIZES, *SEARCH_R1_LENGTHS,
                       f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
                       "trainer.val_before_train=false", "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}",
                       "trainer.device=cpu", *overrides]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode != 0:
            sys.exit(f"the run failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        print(f"{args.model}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        print(next(line for line in done.stdout.splitlines() if line.startswith("memory ")))
        for record in read_metrics(out / "metrics.jsonl"):
            step = record["step"]
            rows = [json.loads(line) for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
            longest = max(r["response_length"] for r in rows)
            print(f"step {step}: own peak {record['perf/step_max_rss_gb']:.2f} GiB, estimate at its longest row "
                  f"{record['perf/memory_estimate_gb']:.2f} GiB, longest response {longest} tokens (of {len(rows)} "
                  "rows kept)")


if __name__ == "__main__":
    main()
