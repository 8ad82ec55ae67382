"""Tests of ``verl.workers.rollout.build_rollout``: the config picks and parameterises the engine."""

from __future__ import annotations

import sys

import pytest
import torch

from verl.config import DEMO_CONFIG, load_config
from verl.workers.rollout import build_rollout
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout


def test_hf_engine_from_config(model_dir, prompts):
    """Guards against the factory ignoring rollout.dtype / micro_batch_size / trainer.device."""
    cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=hf",
                       "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.micro_batch_size=3",
                       "trainer.device=cpu"], [DEMO_CONFIG])
    engine = build_rollout(cfg)
    assert isinstance(engine, HFRollout)
    assert engine.model.dtype == torch.bfloat16 and engine.micro_batch_size == 3
    assert engine.model.device.type == "cpu"
    outputs = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=1.0, n=2, seed=0))
    assert len(outputs) == 2 * len(prompts) and all(1 <= len(o.token_ids) <= 4 for o in outputs)


def test_missing_vllm_names_the_fix(model_dir, monkeypatch):
    """Guards against a bare ModuleNotFoundError from deep inside an import when vLLM is not installed:
    the error must say which extra to install or which key to set instead."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail, as where it is not installed
    monkeypatch.delitem(sys.modules, "verl.workers.rollout.vllm_rollout", raising=False)
    cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=vllm"],
                      [DEMO_CONFIG])
    with pytest.raises(ImportError, match=r"\[cpu\].*\[gpu\].*actor_rollout_ref\.rollout\.name=hf"):
        build_rollout(cfg)
