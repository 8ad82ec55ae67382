"""The device's measured dense matmul rate, the peak the trainer's ``perf/mfu/*`` divide by (figures, never pass/fail).

    python benchmarks/bench_peak.py [--device cpu|cuda] [--dtypes float32,bfloat16] [--sizes 512,1024,2048]
                                    [--threads N]

For each dtype and matrix size: the best of 5 timed products after a warm-up (``verl.workers.flops
.measure_peak_flops``), in TFLOP/s. The trainer measures the same at start-up at the default size (4096 on a GPU,
1024 on a CPU) unless ``trainer.peak_tflops`` is set; the larger sizes show how far that is from the best rate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verl.workers.flops import measure_peak_flops  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--sizes", default="")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [1024, 4096, 8192] if args.device.startswith("cuda") else [512, 1024, 2048])
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"dense matmul peak on {name}")
    for dtype in args.dtypes.split(","):
        rates = [f"{size}: {measure_peak_flops(args.device, dtype, size, repeats=5) / 1e12:8.3f}" for size in sizes]
        print(f"  {dtype:9s} TFLOP/s by size  " + "  ".join(rates))


if __name__ == "__main__":
    main()
