"""The files a run reads exist: model directories and data files, checked when a run starts (not when a config is
built, so configs can be built and checked anywhere). Shared by the RL config (``verl.config.rl``) and the SFT
config (``verl.config.sft``); each error names the key, what is wrong and what is allowed.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from verl.errors import ConfigError

DEMO_DATA = Path("data/demo")  # where `make demo` builds the demo's policy, corpus and parquet (configs/demo.yaml)


def nearest_model_dirs(missing: Path) -> str:
    """``; did you mean A?`` naming the model directories (holding config.json) beside ``missing`` whose names are
    nearest to its name; "" when its parent does not exist or none is near."""
    parent = missing.parent
    if not parent.is_dir():
        return ""
    try:
        names = [d.name for d in parent.iterdir() if (d / "config.json").is_file()]
    except OSError:
        return ""
    near = difflib.get_close_matches(missing.name, names, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(str(parent / name) for name in near)}?" if near else ""


def check_model_dir(key: str, path: str | None) -> None:
    """A local model directory must exist and hold config.json; a missing path that looks like a hub id
    (``owner/name``) is left to transformers."""
    if path is None:
        raise ConfigError(f"config key {key} is not set: name the policy (a Hugging Face model directory with "
                          f"config.json, tokenizer and weights, e.g. {key}=/models/Qwen2.5-3B); the embedded demo "
                          "sets it with --config configs/demo.yaml (what `make demo` runs)")
    p = Path(path)
    hub_like = re.fullmatch(r"[\w.-]+/[\w.-]+", path) is not None and not path.startswith(".")
    if not p.exists() and not hub_like:
        raise ConfigError(f"config key {key}={path!r} is invalid: no such directory{nearest_model_dirs(p)} "
                          "(allowed: a Hugging Face model directory with config.json, tokenizer and weights; "
                          + ("the demo's policy is built by `make demo`)" if p.parts[:2] == DEMO_DATA.parts else
                             "a GGUF file is converted into one by search-r1-import-model)"))
    if p.exists() and not (p / "config.json").is_file():
        raise ConfigError(f"config key {key}={path!r} is invalid: the directory has no config.json (allowed: a "
                          "Hugging Face model directory with config.json, tokenizer and weights)")


def check_files(key: str, value: str, allowed: str) -> None:
    """Each file of ``value`` (comma-separated) exists; ConfigError naming the key, the missing file and what the
    key allows (``allowed``, e.g. "comma-separated parquet files of trajectories") otherwise."""
    for name in [f.strip() for f in value.split(",") if f.strip()] or [value]:
        if not Path(name).is_file():
            raise ConfigError(f"config key {key}={value!r} is invalid: {name!r} does not exist (allowed: {allowed})")
