"""Peak host memory of the actor's log-prob + entropy pass over a 151k vocabulary (figures, not pass/fail).

The training step's [batch, length, vocabulary] tensors come from one place: the response
log-probs and entropy of a micro-batch (``verl.workers.model_utils.response_log_probs``), with
gradients for the update. This script measures that pass alone, for a model with Qwen2.5-0.5B's
head (hidden 896, vocabulary 151,936) and a few layers, in a fresh process per checkout, so that
an older commit can be compared with this one:

    python benchmarks/bench_logprob_memory.py [--rows 4] [--length 1024] [--layers 2]
        [--before DIR]   # DIR: a checkout of an older commit (e.g. `git worktree add DIR <commit>`)

Per checkout it prints the process's peak resident set after one forward + backward of
log-probs and entropy (entropy with gradient, as with an entropy bonus), the resident set just
before the pass, and the difference: the pass's own peak. The float32 logits of the micro-batch
alone are rows x length x 151,936 x 4 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30


def child(rows: int, length: int, layers: int) -> dict:
    """Run in the checkout under test (its ``verl`` first on sys.path): one forward + backward of the pass."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.protocol import Batch
    from verl.workers.model_utils import response_log_probs

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    prompt = 128
    ids = torch.randint(0, 151643, (rows, prompt + length))
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                   "position_ids": torch.arange(prompt + length).expand(rows, -1).clone(),
                   "responses": ids[:, prompt:]})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    log_prob, entropy = response_log_probs(model, batch, torch.device("cpu"), torch.float32, with_entropy=True,
                                           entropy_grad=True)
    (log_prob.mean() - 0.01 * entropy.mean()).backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"before_pass_gb": before / GIB, "peak_gb": peak / GIB, "pass_gb": (peak - before) / GIB}


def run(code: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--rows", str(args.rows),
                           "--length", str(args.length), "--layers", str(args.layers)],
                          cwd=code, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4, help="micro-batch rows")
    parser.add_argument("--length", type=int, default=1024, help="response tokens per row (prompt: 128)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--before", type=Path, default=None, help="checkout of an older commit to compare with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.rows, args.length, args.layers)))
        return
    checkouts = {"this checkout": ROOT} | ({f"before ({args.before})": args.before.resolve()} if args.before else {})
    logits_gb = args.rows * args.length * 151936 * 4 / GIB
    print(f"hidden 896, vocabulary 151,936, {args.layers} layers; micro-batch {args.rows} x (128 + {args.length}) "
          f"tokens; float32 logits of the responses: {logits_gb:.2f} GiB")
    for name, code in checkouts.items():
        r = run(code, args)
        print(f"{name:<40} peak RSS {r['peak_gb']:6.2f} GiB   before the pass {r['before_pass_gb']:5.2f} GiB   "
              f"the pass {r['pass_gb']:5.2f} GiB ({r['pass_gb'] / logits_gb:.1f}x the logits)")


if __name__ == "__main__":
    main()
