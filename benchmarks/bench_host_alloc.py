"""Host allocator settings for CPU training: time, page faults and peak resident set of the same micro-batches,
glibc's default (its mmap threshold rises with each freed block), ``map_large_host_allocations`` (a fixed 1 MiB
threshold, ``trainer.host_memory=release``) and ``keep_freed_host_memory`` (``reuse``; ``reuse-guarded``: with the
``FreedMemoryGuard`` thread, as the default ``trainer.host_memory=reuse`` runs), each in a fresh process, alternated
(figures, not pass/fail).

    python benchmarks/bench_host_alloc.py --model data/models/smollm2-135m-instruct [--rounds 2] [--steps 3]
        [--micro 4] [--lengths 640,480,560,320] [--dtype bfloat16]

A step is what the actor's update does per micro-batch: forward under autocast, the chunked log-probs and entropy
(``verl.algorithms.logprobs``), a loss on their mean, backward,
for micro-batches of ``--micro`` rows at each of ``--lengths`` (GRPO rows differ in length from one micro-batch to
the next), then ``release_host_memory`` (as ``TrainState`` does on a host under ``release``; not under ``reuse``)
and an AdamW step. Prints per setting: the median step time, the page faults of a step, and the peak resident set
of the steps (the kernel's high-water mark after the first step, so model loading is not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time, torch
from transformers import AutoModelForCausalLM
from verl.algorithms.logprobs import logprobs_and_entropy
import resource
from verl.workers.process_memory import (FreedMemoryGuard, keep_freed_host_memory, map_large_host_allocations,
                                         peak_memory_metrics, release_host_memory)
model_dir, threshold, steps, micro = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lengths, dtype = [int(x) for x in sys.argv[5].split(",")], getattr(torch, sys.argv[6])
reuse = threshold < 0
if reuse:
    assert keep_freed_host_memory()
    if threshold == -2:  # and the thread that trims when the host runs short, as trainer.host_memory=reuse starts it
        assert FreedMemoryGuard.start_once() is not None
elif threshold:
    assert map_large_host_allocations(threshold)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
model.gradient_checkpointing_disable()
opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
vocab = model.config.vocab_size
times, peaks, faults = [], [], []
cpu = torch.device("cpu")
peak_memory_metrics(cpu)
for step in range(steps):
    start = time.perf_counter()
    faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for length in lengths:
        ids = torch.randint(vocab, (micro, length))
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=ids).logits
        logp, _ = logprobs_and_entropy(logits[:, :-1], ids[:, 1:], with_entropy=True)
        loss = -logp.mean()
        loss.backward()
        del logits, logp, loss
        if not reuse:
            release_host_memory()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - start)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted)
    peaks.append(peak_memory_metrics(cpu)["perf/step_max_rss_gb"])
huge = [int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages")]
print(json.dumps({"times": times, "peaks": peaks, "faults": faults, "huge_kib": huge[0] if huge else 0}))
"""


HUGE_PAGES = "glibc.malloc.hugetlb=1"  # glibc >= 2.35: madvise(MADV_HUGEPAGE) on what malloc maps
KEEP_TOP = "glibc.malloc.trim_threshold=67108864"  # the heap's top is given back only above 64 MiB free
# name -> (mmap threshold in bytes, 0 = glibc's own rule, -1 = keep_freed_host_memory, -2 = and FreedMemoryGuard;
# GLIBC_TUNABLES of the process)
SETTINGS = {"default": (0, ""), "mapped": (1 << 20, ""), "reuse": (-1, ""), "reuse-guarded": (-2, ""),
            "mapped-huge": (1 << 20, HUGE_PAGES),
            "huge": (0, HUGE_PAGES), "mapped-32m": (32 << 20, ""), "mapped-32m-huge": (32 << 20, HUGE_PAGES),
            # a fixed mmap threshold also keeps glibc's trim threshold at 128 KiB (the default rule raises it to twice
            # the mmap threshold): the heap's top is then given back and faulted in again on every micro-batch
            "mapped-trim": (1 << 20, KEEP_TOP), "mapped-trim-huge": (1 << 20, f"{KEEP_TOP}:{HUGE_PAGES}")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a Hugging Face model directory")
    p.add_argument("--rounds", type=int, default=2, help="fresh processes per setting, alternated")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--lengths", default="640,480,560,320", help="tokens per row of each micro-batch of a step")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--settings", default="mapped,reuse", help=f"comma-separated, of: {', '.join(SETTINGS)}")
    args = p.parse_args()
    names = args.settings.split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        p.error(f"--settings: unknown {unknown}; allowed: {', '.join(SETTINGS)}")
    if args.steps < 2:
        p.error(f"--steps {args.steps}: at least 2 (the first step warms up and is not counted)")
    results: dict[str, dict[str, list[float]]] = {n: {"times": [], "peaks": [], "faults": []} for n in names}
    for round_ in range(args.rounds):
        for name in names:
            threshold, tunables = SETTINGS[name]
            env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
            if tunables:
                env["GLIBC_TUNABLES"] = tunables
            done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), args.model, str(threshold),
                                   str(args.steps), str(args.micro), args.lengths, args.dtype],
                                  cwd=ROOT, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"{name} round {round_}: exit {done.returncode}\n{done.stderr[-2000:]}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            results[name]["times"] += got["times"][1:]  # the first step warms up
            results[name]["peaks"] += got["peaks"]
            results[name]["faults"] += got["faults"][1:]
            print(f"round {round_} {name:12s} step s {[round(t, 1) for t in got['times']]}  "
                  f"peak GiB {[round(x, 2) for x in got['peaks']]}  huge pages {got['huge_kib'] >> 10} MiB",
                  flush=True)
    for name, r in results.items():
        print(f"{name:12s} median step {statistics.median(r['times']):.1f} s  page faults a step "
              f"{statistics.median(r['faults']) / 1e6:.2f}M  max peak {max(r['peaks']):.2f} GiB  "
              f"median peak {statistics.median(r['peaks']):.2f} GiB")


if __name__ == "__main__":
    main()
