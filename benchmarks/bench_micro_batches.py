"""What the forward passes compute on a real run's batches: micro-batches of fixed rows against token-budget ones
(``use_dynamic_bsz``), grouped in batch order (as before) and by length (``verl.workers.model_utils``).

    python benchmarks/bench_micro_batches.py RUN_DIR [--model data/models/smollm2-135m-instruct] [--steps 1 2 3]
                                             [--time]

``RUN_DIR`` is a training run's directory (its ``rollouts/<step>.jsonl``: each trajectory's prompt text and
``response_length``, in batch order). A micro-batch computes rows x its width without the all-padding columns (a
row's prompt is left-padded, its response right-padded), so the figure per variant is the tokens computed against
the real tokens. ``--time`` also times the model's forward over the response (the reference log-prob pass) for
each variant, side by side, on this machine's CPU; the lengths come from the run, the token ids are random.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verl.protocol import Batch  # noqa: E402
from verl.workers.model_utils import budget_groups, micro_batches, response_log_probs, row_spans  # noqa: E402


def step_batch(rollouts: Path, tokenizer, vocab: int) -> Batch:
    """The step's trajectories as a padded batch (random ids at their real lengths), in the file's order."""
    rows = [json.loads(line) for line in rollouts.read_text().splitlines() if line.strip()]
    prompts = [len(tokenizer(r["input"], add_special_tokens=False)["input_ids"]) for r in rows]
    responses = [int(r["response_length"]) for r in rows]
    P, R = max(prompts), max(responses)
    gen = torch.Generator().manual_seed(0)
    mask = torch.zeros(len(rows), P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        mask[i, P - p:P + r] = 1
    ids = torch.randint(3, vocab, mask.shape, generator=gen) * mask
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": positions, "responses": ids[:, P:]})


def in_batch_order(batch: Batch, max_tokens: int) -> list[Batch]:
    """Token-budget micro-batches of consecutive rows in batch order (the grouping before length order)."""
    first, last = row_spans(batch["attention_mask"])
    return [batch.index(g) for g in budget_groups(list(range(len(batch))), first, last, max_tokens)]


def computed(micros: list[Batch]) -> int:
    """Rows x width without the all-padding columns, summed over the micro-batches."""
    total = 0
    for micro in micros:
        cols = micro["attention_mask"].any(dim=0).nonzero().flatten()
        total += len(micro) * int(cols[-1] - cols[0] + 1)
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a training run's directory (with rollouts/<step>.jsonl)")
    p.add_argument("--model", type=Path, default=ROOT / "data/models/smollm2-135m-instruct")
    p.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--budgets", type=int, nargs="+", default=[8192, 16384], help="ppo_max_token_len_per_gpu values")
    p.add_argument("--rows", type=int, nargs="+", default=[4, 8], help="fixed micro-batch sizes (rows)")
    p.add_argument("--time", action="store_true", help="also time the forward over the response per variant")
    args = p.parse_args()
    for path in [args.run / "rollouts" / f"{s}.jsonl" for s in args.steps]:
        if not path.exists():
            raise SystemExit(f"no {path}: pass a training run's directory and steps it has rollouts for")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).eval() if args.time else None
    print("| step | rows | real tokens | variant | micro-batches | tokens computed | x real |" +
          (" forward s |" if args.time else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.time else ""))
    for step in args.steps:
        batch = step_batch(args.run / "rollouts" / f"{step}.jsonl", tokenizer, len(tokenizer))
        real = int(batch["attention_mask"].sum())
        variants = {f"{r} rows, batch order": list(micro_batches(batch, r)) for r in args.rows}
        for budget in args.budgets:
            variants[f"{budget} tokens, batch order"] = in_batch_order(batch, budget)
            variants[f"{budget} tokens, by length"] = list(micro_batches(batch, 1, budget))
        for name, micros in variants.items():
            line = f"| {step} | {len(batch)} | {real:,} | {name} | {len(micros)} | {computed(micros):,} | " \
                   f"{computed(micros) / real:.2f} |"
            if model is not None:
                start = time.perf_counter()
                with torch.no_grad():
                    for micro in micros:
                        response_log_probs(model, micro, torch.device("cpu"), torch.bfloat16)
                line += f" {time.perf_counter() - start:.1f} |"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
