"""The memory estimate of the HF engine's static KV cache (docs/design.md, "The HF engine's decode loop")."""

from __future__ import annotations

import pytest

from tests.verl.workers.worker_test_utils import make_config
from verl.workers.memory import estimate_memory
from verl.workers.rollout.hf_decode import LENGTH_QUANTUM


def test_the_static_cache_is_estimated_at_its_padded_shape(tiny_model_dir):
    """Guards the estimate against the static cache's shape: its rows are padded to a power of two and its length
    rounded up to ``LENGTH_QUANTUM``, so it holds more than the dynamic cache's rows x tokens (an estimate at the
    unpadded shape would under-count the GPU's memory)."""
    common = ["data.train_batch_size=3", "actor_rollout_ref.rollout.n=2",
              "actor_rollout_ref.rollout.micro_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=6",
              "critic.ppo_mini_batch_size=6"]
    dynamic = estimate_memory(make_config(tiny_model_dir, *common, "actor_rollout_ref.rollout.hf_kv_cache=dynamic"),
                              tokens=300)
    static = estimate_memory(make_config(tiny_model_dir, *common, "actor_rollout_ref.rollout.hf_kv_cache=static"),
                             tokens=300)
    rows, padded_rows = 6, 8  # 3 prompts x 2 samples -> a batch of 8
    padded_tokens = -(-300 // LENGTH_QUANTUM) * LENGTH_QUANTUM
    assert static.kv_cache == pytest.approx(dynamic.kv_cache * padded_rows * padded_tokens / (rows * 300))
