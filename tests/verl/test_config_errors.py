"""A config error is refused at once and points the way: a misspelt key before torch is imported, with the nearest
key named; a missing model directory of the user's own with the nearest one beside it, and no `make demo`.

Guards against issue 57's item 7: a bad key took 24 s to refuse (torch, transformers and the trainer were imported
before the config was read), the message offered no "did you mean", and a user whose own model directory was
missing was told to build the demo's policy with `make demo`. Speed itself is not asserted (a figure, printed by
benchmarks/bench_config_error.py); what the time came from is: the modules imported before the refusal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl.config import ConfigError, check_paths, load_config

ROOT = Path(__file__).resolve().parents[2]

# Runs an entry point's main in a fresh interpreter, then reports its status and the heavy modules it imported.
PROBE = """
import json, sys
from {module} import main
code = main({argv!r})
heavy = sorted(m for m in ("torch", "transformers", "ray", "vllm") if m in sys.modules)
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def fresh(module: str, argv: list[str]) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module, argv=argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("module, argv, suggested", [
    ("verl.trainer.main_ppo", ["actor_rollout_ref.actor.optim.lrr=1e-6"], "actor_rollout_ref.actor.optim.lr"),
    ("verl.trainer.main_ppo", ["retriver.url=http://127.0.0.1:8000"], "retriever.url"),
    ("verl.trainer.main_sft", ["optim.lrr=1e-5"], "optim.lr"),
], ids=["ppo", "ppo-section", "sft"])
def test_a_misspelt_key_is_refused_before_torch_is_imported_naming_the_nearest_key(module, argv, suggested):
    result, stderr = fresh(module, argv)
    assert result == {"code": 2, "heavy": []}, stderr[-3000:]
    key = argv[0].split("=")[0]
    assert f"error: unknown config key {key!r}; did you mean {suggested}? (" in stderr, stderr[-3000:]


def test_a_missing_model_directory_of_ones_own_names_the_nearest_and_not_make_demo(tmp_path):
    (tmp_path / "models" / "Qwen2.5-3B-Instruct").mkdir(parents=True)
    (tmp_path / "models" / "Qwen2.5-3B-Instruct" / "config.json").write_text("{}")
    typo = tmp_path / "models" / "Qwen2.5-3B-Instrct"
    cfg = load_config([f"actor_rollout_ref.model.path={typo}", "retriever.url=http://127.0.0.1:8000"])
    with pytest.raises(ConfigError) as refused:
        check_paths(cfg)
    message = str(refused.value)
    assert f"no such directory; did you mean {tmp_path / 'models' / 'Qwen2.5-3B-Instruct'}?" in message
    assert "make demo" not in message and "search-r1-import-model" in message
    demo = load_config(["actor_rollout_ref.model.path=data/demo/no_policy_here"])
    with pytest.raises(ConfigError, match="the demo's policy is built by `make demo`"):
        check_paths(demo)
