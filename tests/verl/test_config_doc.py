"""docs/config.md is the output of ``python -m verl.config_doc``: guards against the key reference drifting from
configs/*.yaml and verl/config_compat.py (a key renamed in the YAML but not in the docs, a default changed)."""

from __future__ import annotations

from pathlib import Path

from verl.config import DEFAULT_CONFIG, load_config
from verl.config_doc import documented_keys, render

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_current():
    assert (ROOT / "docs" / "config.md").read_text() == render(), \
        "docs/config.md is stale: run `.venv/bin/python -m verl.config_doc > docs/config.md`"


def test_every_yaml_key_is_documented_and_loads():
    """Every leaf key of the YAML has a comment above it, and overriding it with its own default loads."""
    rows = documented_keys(DEFAULT_CONFIG)
    assert len(rows) > 80
    undocumented = [key for key, _, comment in rows if not comment]
    assert undocumented == []
    for key, value, _ in rows:
        if "${" not in value:
            load_config([f"{key}={value}"])
