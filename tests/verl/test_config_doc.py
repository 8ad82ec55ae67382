"""configs/ppo_trainer.yaml and docs/config.md are the output of ``python -m verl.config.doc``: guards against either
drifting from the declarations (a default changed, a key renamed, a choice registered, a spelling added)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from verl.config import DEFAULT_CONFIG, load_config
from verl.config.doc import documented_keys, yaml_value

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_current():
    """Run in a fresh process: only the built-in and the default recipe's registrations are listed (tests of this
    process register estimators of their own)."""
    done = subprocess.run([sys.executable, "-m", "verl.config.doc", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:] + " (run `make docs`)"


def test_every_yaml_key_is_documented_and_loads():
    """Every leaf key of the YAML has a comment above it, and overriding it with its own default loads."""
    rows = documented_keys(DEFAULT_CONFIG)
    assert len(rows) > 80
    undocumented = [key for key, _, comment in rows if not comment]
    assert undocumented == []
    # all at once (one load, not ~200: each load is ~50 ms); a value that does not read back as its key's type is
    # refused naming the key all the same
    load_config([f"{key}={value}" for key, value, _ in rows if "${" not in value])


def test_yaml_values_read_back_as_written():
    for value in (None, True, 1e-6, 1e-5, 0.001, 16.0, 3, "token-mean", "search_r1.recipe", "null", "1", [],
                  ["console", "jsonl"], "${trainer.project_name}"):
        text = yaml_value(value)
        assert load_yaml_value(text) == value, (value, text)


def load_yaml_value(text: str):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(f"k: {text}"), resolve=False)["k"]
