"""Throughput of the two rollout engines and the cost of a weight sync (figures, never pass/fail).

    python benchmarks/bench_rollout.py [--model DIR] [--prompts 64] [--max-tokens 128] [--repeats 3]
                                       [--engines vllm,hf] [--threads N] [--hidden-size 128] [--layers 2]

Both engines get the same prompts (random token ids, 16-64 long, fixed seed) and sample
``--max-tokens`` new tokens at temperature 1 with no stop strings, so nearly every row runs to the
limit; tokens/s counts the tokens actually returned. Each engine is warmed up with one call, then
timed over ``--repeats`` calls (median). Weight sync: median seconds of ``sync_weights`` with the
model's full state dict. Without ``--model`` a tiny project model (Qwen2, head_dim 64, by default
hidden 128 and 2 layers; see ``--hidden-size``/``--layers``) is built in a temporary directory.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data_prep.tiny_model import save_tiny_model  # noqa: E402
from verl.workers.rollout.base import SamplingParams  # noqa: E402


def build_engine(name: str, model: str, max_model_len: int):
    if name == "vllm":
        from verl.workers.rollout.vllm_rollout import VLLMRollout

        return VLLMRollout(model, max_model_len=max_model_len)
    from verl.workers.rollout.hf_rollout import HFRollout

    return HFRollout(model)


def make_prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randint(16, 64))] for _ in range(count)]


def bench(name: str, model: str, prompts: list[list[int]], max_tokens: int, repeats: int) -> dict[str, float]:
    start = time.perf_counter()
    engine = build_engine(name, model, max_model_len=64 + max_tokens)
    load_s = time.perf_counter() - start
    engine.generate(prompts[:4], SamplingParams(max_tokens=8))  # warm-up
    seconds, tokens = [], []
    for rep in range(repeats):
        start = time.perf_counter()
        outputs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=rep))
        seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(o.token_ids) for o in outputs))
    state = AutoModelForCausalLM.from_pretrained(model).state_dict()
    sync_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.sync_weights(state.items())
        sync_s.append(time.perf_counter() - start)
    gen_s = statistics.median(seconds)
    return {"load_s": load_s, "gen_s": gen_s, "tokens": statistics.median(tokens),
            "tokens_per_s": statistics.median(tokens) / gen_s, "sync_s": statistics.median(sync_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF model directory (default: build the tiny model)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default="vllm,hf")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--hidden-size", type=int, default=128, help="of the built model (heads = hidden / 64)")
    parser.add_argument("--layers", type=int, default=2, help="of the built model")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        texts = [f"sentence number {i} <search> q </search>" for i in range(300)]
        model = args.model or str(save_tiny_model(
            tmp, texts, vocab_size=512, hidden_size=args.hidden_size, num_layers=args.layers,
            num_heads=args.hidden_size // 64, intermediate_size=4 * args.hidden_size))
        vocab = AutoModelForCausalLM.from_pretrained(model).config.vocab_size
        prompts = make_prompts(args.prompts, vocab)
        results = {name: bench(name, model, prompts, args.max_tokens, args.repeats)
                   for name in args.engines.split(",")}
    print(f"{args.prompts} prompts x {args.max_tokens} new tokens, torch threads {torch.get_num_threads()}, "
          f"median of {args.repeats}")
    for name, r in results.items():
        print(f"{name:5s} load {r['load_s']:6.1f} s | generate {r['gen_s']:6.2f} s, {r['tokens']:.0f} tokens, "
              f"{r['tokens_per_s']:8.0f} tokens/s | weight sync {1000 * r['sync_s']:7.1f} ms")
    if {"vllm", "hf"} <= results.keys():
        print(f"vllm / hf tokens/s ratio: {results['vllm']['tokens_per_s'] / results['hf']['tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
