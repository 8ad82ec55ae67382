"""Each rollout engine against the library call it wraps, and the cost of a weight sync (figures, never pass/fail).

    python benchmarks/bench_rollout.py [--model DIR] [--random-weights] [--device cpu|cuda] [--dtype float32]
                                       [--prompts 16] [--prompt-tokens 100-200] [--data PARQUET --samples 4]
                                       [--max-tokens 64] [--repeats 3] [--engines hf,hf-static,vllm] [--threads N]
                                       [--hidden-size 128] [--layers 2]

For each engine the same prompts (random token ids of ``--prompt-tokens`` length, fixed seed; or with ``--data``
the first ``--prompts`` prompts of a QA parquet, rendered as the trainer renders them, each ``--samples`` times: a
first turn of the agent loop) are continued at temperature 1 with up to ``--max-tokens`` new tokens, alternately by:
  * the engine (``HFRollout`` / ``VLLMRollout.generate``) with what the agent loop asks of it: its log-probs and the
    stop strings ``</search>`` and ``</answer>`` (found in the decoded text), and
  * the plain library call on the engine's own model: ``model.generate`` (left-padded batch, the same sampling,
    eos and pad, and transformers' own ``StopStringCriteria`` on the same stop strings, built once; a row that has
    stopped stays in the batch until the last row stops, as ``generate`` keeps it) / ``vllm.LLM.generate`` (token
    prompts, the same sampling and stop strings, vLLM's own stop check; no log-probs).
With real prompts, rows stop at different lengths and the HF engine's dropping of ended rows shows (a sampled
trajectory that never closes its tag runs to ``--max-tokens`` alone, not with the whole batch).
Engines: ``hf`` (the HF engine with its default cache for the device: static with CUDA graphs on a GPU, dynamic on a
CPU), ``hf-dynamic``, ``hf-static`` (the static cache; with CUDA graphs on a GPU), ``hf-eager`` (static, no graphs),
``vllm``, ``vllm-compiled`` (vLLM's model compiled by torch.compile when the engine starts,
``rollout.enforce_eager=false``; its load time includes the compile). The physical limit printed last: a decode step
reads every weight once, so a batch of B rows makes at most B x (memory bandwidth / bytes of weights) tokens a second
(bandwidth measured here by copying a large buffer; the KV cache's reads and the prompt pass are not counted, so real
engines stay below it).
Tokens/s counts the tokens each returned (up to and including eos); the ratio engine / plain is the engine's
overhead (1.0 = none). MFU: the model FLOPs of the prompts and the returned tokens (``verl.workers.flops``) over
the time and the device's measured matmul peak in the engine's dtype. Medians over ``--repeats`` pairs after one
warm-up pair. Weight sync: the median seconds of ``sync_weights`` with the model's full state dict, in the engine's
dtype (as the trainer sends it).

Without ``--model`` a tiny project model (Qwen2, head_dim 64, ``--hidden-size`` / ``--layers``) is built in a
temporary directory. ``--random-weights`` keeps ``--model``'s config and tokenizer but draws new weights (the speed
of a real model's shape where its weights cannot be copied, e.g. a GPU machine without network).
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
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data_prep.tiny_model import save_tiny_model  # noqa: E402
from verl.workers.flops import ModelFlops, measure_peak_flops  # noqa: E402
from verl.workers.model_utils import DTYPES  # noqa: E402
from verl.workers.rollout.base import SamplingParams  # noqa: E402

STOPS = ["</search>", "</answer>"]


def make_prompts(count: int, vocab: int, lengths: tuple[int, int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randint(*lengths))] for _ in range(count)]


HF_CACHES = {"hf": ("auto", True), "hf-dynamic": ("dynamic", False), "hf-static": ("static", True),
             "hf-eager": ("static", False)}  # engine name -> (kv_cache, cuda_graphs)


def hf_pair(model: str, args, name: str = "hf"):
    """(engine call, plain call) for the HF engine; each returns the generated ids per row."""
    from verl.workers.rollout.hf_rollout import HFRollout, truncate_at_stop

    kv_cache, graphs = HF_CACHES[name]
    engine = HFRollout(model, dtype=args.dtype, device=args.device, micro_batch_size=args.prompts * args.samples,
                       kv_cache=kv_cache, cuda_graphs=graphs)
    stops = StoppingCriteriaList([StopStringCriteria(engine.tokenizer, STOPS)])  # built once: 0.4 s for SmolLM2

    def engine_call(prompts, seed):
        outs = engine.generate(prompts, SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=seed,
                                                       logprobs=True, stop=STOPS))
        return [o.token_ids for o in outs]

    def plain_call(prompts, seed):
        torch.manual_seed(seed)
        ids, mask = engine._left_pad(prompts)  # [B, P]
        config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.max_tokens,
                                  eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id)
        with torch.inference_mode():
            out = engine.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                        stopping_criteria=stops)
        rows = out[:, ids.shape[1]:].tolist()
        return [truncate_at_stop(row, engine.eos_ids, STOPS, engine._decode)[0] for row in rows]

    return engine, engine_call, plain_call


VLLM_ENGINES = ("vllm", "vllm-compiled")


def vllm_pair(model: str, args, name: str):
    from vllm import SamplingParams as VllmParams
    from vllm.inputs import TokensPrompt

    from verl.workers.rollout.vllm_rollout import VLLMRollout

    engine = VLLMRollout(model, max_model_len=args.prompt_tokens[1] + args.max_tokens, dtype=args.dtype,
                         enforce_eager=name == "vllm")

    def engine_call(prompts, seed):
        outs = engine.generate(prompts, SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=seed,
                                                       logprobs=True, stop=STOPS))
        return [o.token_ids for o in outs]

    def plain_call(prompts, seed):
        params = [VllmParams(temperature=1.0, max_tokens=args.max_tokens, seed=seed + i, stop=list(STOPS))
                  for i in range(len(prompts))]
        results = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [list(r.outputs[0].token_ids) for r in results]

    return engine, engine_call, plain_call


def bench(name: str, model: str, prompts: list[list[int]], args) -> dict[str, float]:
    start = time.perf_counter()
    pair = vllm_pair if name in VLLM_ENGINES else hf_pair
    engine, engine_call, plain_call = pair(model, args, name)
    load_s = time.perf_counter() - start
    flops = ModelFlops.of(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).to("meta"))
    rates: dict[str, list[float]] = {"engine": [], "plain": []}
    work: dict[str, list[float]] = {"engine": [], "plain": []}
    returned: dict[str, list[int]] = {"engine": [], "plain": []}  # tokens a call returned (all rows)
    for rep in range(args.repeats + 1):  # rep 0 warms both up
        for kind, call in (("plain", plain_call), ("engine", engine_call)):
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            rows = call(prompts, rep)
            if args.device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            if rep:
                rates[kind].append(sum(map(len, rows)) / seconds)
                returned[kind].append(sum(map(len, rows)))
                lengths = torch.tensor([len(p) + len(r) for p, r in zip(prompts, rows, strict=True)])
                work[kind].append(flops.forward(lengths) / seconds)
    # the weights as the trainer sends them: already in the engine's dtype (ActorRolloutWorker._full_weights)
    state = AutoModelForCausalLM.from_pretrained(model, dtype=DTYPES[args.dtype]).state_dict()
    sync_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine.sync_weights(state.items())
        sync_s.append(time.perf_counter() - start)
    return {"load_s": load_s, "sync_s": statistics.median(sync_s),
            **{f"{kind}_tokens_per_s": statistics.median(v) for kind, v in rates.items()},
            **{f"{kind}_flops": statistics.median(v) for kind, v in work.items()},
            **{f"{kind}_tokens": statistics.median(v) for kind, v in returned.items()}}


def memory_bandwidth(device: str, megabytes: int = 1024, repeats: int = 5) -> float:
    """Bytes a second that a copy of a large buffer moves on ``device`` (read + write), the best of ``repeats``."""
    src = torch.empty(megabytes << 18, dtype=torch.float32, device=device)  # megabytes MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF model directory (default: build the tiny model)")
    parser.add_argument("--random-weights", action="store_true", help="--model's config and tokenizer, new weights")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", default="100-200", help="min-max prompt length")
    parser.add_argument("--data", help="QA parquet whose first --prompts prompts are used (default: random ids)")
    parser.add_argument("--samples", type=int, default=1, help="with --data: rows per prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--hidden-size", type=int, default=128, help="of the built model (heads = hidden / 64)")
    parser.add_argument("--layers", type=int, default=2, help="of the built model")
    args = parser.parse_args()
    args.prompt_tokens = tuple(int(x) for x in args.prompt_tokens.split("-"))
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            texts = [f"sentence number {i} <search> q </search>" for i in range(300)]
            model = str(save_tiny_model(tmp, texts, vocab_size=512, hidden_size=args.hidden_size,
                                        num_layers=args.layers, num_heads=args.hidden_size // 64,
                                        intermediate_size=4 * args.hidden_size))
        elif args.random_weights:
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).save_pretrained(tmp)
            AutoTokenizer.from_pretrained(model).save_pretrained(tmp)
            model = tmp
        if args.data:
            from verl.utils.dataset import PromptDataset

            dataset = PromptDataset(args.data, AutoTokenizer.from_pretrained(model), 100_000, max_samples=args.prompts)
            prompts = [ids for ids in dataset.prompt_ids for _ in range(args.samples)]
            lengths = [len(ids) for ids in prompts]
            args.prompt_tokens = (min(lengths), max(lengths))
        else:
            args.samples = 1
            prompts = make_prompts(args.prompts, AutoConfig.from_pretrained(model).vocab_size, args.prompt_tokens)
        peak = measure_peak_flops(args.device, args.dtype)
        bandwidth = memory_bandwidth(args.device)
        weight_bytes = sum(p.numel() for p in AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(model)).to("meta").parameters()) * DTYPES[args.dtype].itemsize
        unknown = [name for name in args.engines.split(",") if name not in (*HF_CACHES, *VLLM_ENGINES)]
        if unknown:
            parser.error(f"--engines: unknown {unknown} (allowed: {', '.join([*HF_CACHES, *VLLM_ENGINES])})")
        results = {name: bench(name, model, prompts, args) for name in args.engines.split(",")}
    print(f"{len(prompts)} prompts of {args.prompt_tokens[0]}-{args.prompt_tokens[1]} tokens, up to "
          f"{args.max_tokens} new tokens, {args.device} {args.dtype}, torch threads {torch.get_num_threads()}, "
          f"matmul peak {peak / 1e12:.2f} TFLOP/s, median of {args.repeats}")
    for name, r in results.items():
        print(f"{name:10s} engine {r['engine_tokens_per_s']:9.1f} tokens/s (MFU {r['engine_flops'] / peak:6.2%}) | "
              f"plain {r['plain_tokens_per_s']:9.1f} tokens/s (MFU {r['plain_flops'] / peak:6.2%}) | "
              f"engine / plain {r['engine_tokens_per_s'] / r['plain_tokens_per_s']:5.2f} | load {r['load_s']:5.1f} s "
              f"| weight sync {1000 * r['sync_s']:7.1f} ms | tokens a call (median) {r['engine_tokens']:.0f} / "
              f"{r['plain_tokens']:.0f}")
    limit = len(prompts) * bandwidth / weight_bytes
    print(f"limit {limit:9.1f} tokens/s: {len(prompts)} rows x {bandwidth / 1e9:.0f} GB/s (measured copy) / "
          f"{weight_bytes / 1e9:.3f} GB of weights a step; engines at " + ", ".join(
              f"{name} {r['engine_tokens_per_s'] / limit:.1%}" for name, r in results.items()) + " of it")


if __name__ == "__main__":
    main()
