"""The vLLM engine on CUDA where vLLM is installed (skipped otherwise: the lent GPU machines have none): greedy tokens,
stop strings and log-probs as the HF engine gives them on the same device, and a weight sync that reaches it."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from tests.gpu.gpu_helpers import DEVICE  # noqa: E402
from tests.verl.workers.rollout.rollout_helpers import perturbed  # noqa: E402
from verl.config import DEMO_CONFIG, load_config  # noqa: E402
from verl.workers.rollout import build_rollout  # noqa: E402
from verl.workers.rollout.base import SamplingParams  # noqa: E402

pytestmark = pytest.mark.gpu

STOPS = ["</search>", "</answer>"]


@pytest.fixture(scope="module")
def engines(model_dir):
    """(vLLM, HF) engines on the device, built from the typed config as the trainer builds them; vLLM takes a
    small share of the GPU, since this process holds the other tests' tensors too."""
    def build(name: str):
        return build_rollout(load_config([
            f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.rollout.name={name}",
            "data.max_prompt_length=128", "data.max_start_length=128", "data.max_response_length=128",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.2", "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.25",
            f"trainer.device={DEVICE}"], [DEMO_CONFIG]))

    return build("vllm"), build("hf")


def test_greedy_stops_and_log_probs_agree_with_the_hf_engine(engines, prompts):
    """Guards against the two engines disagreeing on the device (prompt re-tokenised, wrong eos set, stop strings cut
    differently, log-probs after temperature): greedy outputs with stop strings match, log-probs within 1e-3."""
    vllm_engine, hf_engine = engines
    params = SamplingParams(max_tokens=40, temperature=0, stop=STOPS, logprobs=True)
    vllm_out, hf_out = vllm_engine.generate(prompts, params), hf_engine.generate(prompts, params)
    assert [(o.token_ids, o.finish_reason, o.stop_str) for o in vllm_out] == \
        [(o.token_ids, o.finish_reason, o.stop_str) for o in hf_out]
    for v, h in zip(vllm_out, hf_out, strict=True):
        assert v.logprobs == pytest.approx(h.logprobs, abs=1e-3)


def test_weight_sync_reaches_vllm(engines, state_dict, prompts):
    """Guards the in-memory weight sync on the device: perturbed weights change vLLM's greedy tokens to the HF
    engine's under the same weights, and the original weights restore its tokens."""
    vllm_engine, hf_engine = engines
    params = SamplingParams(max_tokens=24, temperature=0)
    before = [o.token_ids for o in vllm_engine.generate(prompts, params)]
    try:
        new_weights = perturbed(state_dict)
        vllm_engine.sync_weights(new_weights.items())
        hf_engine.sync_weights(new_weights.items())
        after = [o.token_ids for o in vllm_engine.generate(prompts, params)]
        assert after == [o.token_ids for o in hf_engine.generate(prompts, params)] and after != before
    finally:
        vllm_engine.sync_weights(state_dict.items())
        hf_engine.sync_weights(state_dict.items())
    assert [o.token_ids for o in vllm_engine.generate(prompts, params)] == before
