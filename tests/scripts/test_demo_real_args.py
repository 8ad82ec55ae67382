"""scripts/demo_real.sh (``make demo-real``): a bad FORMAT, SEED, VARIANT or ENGINE stops before anything is installed,
imported or started, with exit 2 and a message naming the value and what is allowed.

Guards against a typo in ``make demo-real VARIANT=...`` quietly training plain GRPO into the default run directory (or
a run that starts a service and imports a model before failing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("variable", "value", "allowed"), [
    ("DEMO_REAL_FORMAT", "json", "search_r1, hermes"),
    ("DEMO_REAL_SEED", "one", "non-negative integer"),
    ("DEMO_REAL_VARIANT", "grpo-ds", "grpo, grpo_ds, grpo_turn"),
    ("DEMO_REAL_ENGINE", "sglang", "vllm, hf"),
])
def test_a_bad_setting_exits_2_naming_it_before_doing_anything(tmp_path, variable, value, allowed):
    out = tmp_path / "run"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "demo_real.sh")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, variable: value, "DEMO_REAL_DIR": str(out),
                                           "PYTHON": "/nonexistent/python"})
    assert done.returncode == 2, done.stderr
    assert f"{variable}={value}" in done.stderr and allowed in done.stderr, done.stderr
    assert not out.exists()
