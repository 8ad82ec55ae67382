"""The worker methods the trainer calls, on CUDA: the actor's and the reference's passes in bfloat16, the actor's
update, and the weight sync into the HF engine on the same device (``ActorRolloutWorker.sync_rollout_weights``)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.gpu.gpu_helpers import DEVICE
from tests.verl.workers.worker_test_utils import add_targets, make_config, random_batch
from verl.protocol import Batch
from verl.workers.actor import ActorWorker
from verl.workers.actor_rollout import ActorRolloutWorker
from verl.workers.reference import RefWorker
from verl.workers.rollout.base import SamplingParams

pytestmark = pytest.mark.gpu

BF16 = (f"trainer.device={DEVICE}", "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16")


def test_actor_and_reference_passes_in_bfloat16(tiny_model_dir):
    """Guards against the device passes breaking or drifting: in bfloat16 on the device, the actor's and the
    reference's log-probs stay within bfloat16 rounding of float32 on the CPU, the actor keeps float32 weights on
    the device through an update with finite loss and gradient norm that changes them, and the reference is loaded
    in bfloat16 and stays frozen."""
    batch = random_batch(seed=18)
    fp32_cpu = ActorWorker(make_config(tiny_model_dir), total_steps=1).compute_log_prob(batch)["old_log_probs"]
    cfg = make_config(tiny_model_dir, *BF16)
    actor = ActorWorker(cfg, total_steps=1)
    assert actor.device.type == DEVICE and actor.dtype == torch.bfloat16
    log_probs = actor.compute_log_prob(batch)["old_log_probs"]
    torch.testing.assert_close(log_probs, fp32_cpu, atol=0.1, rtol=0.02)
    before = {name: p.detach().clone() for name, p in actor.model.named_parameters()}
    metrics = actor.update_actor(add_targets(batch.union(Batch({"old_log_probs": log_probs})), seed=18))
    assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
    params = dict(actor.model.named_parameters())
    assert all(p.dtype == torch.float32 and p.device.type == DEVICE for p in params.values())
    assert any(not torch.equal(params[name].detach(), value) for name, value in before.items())

    ref = RefWorker(cfg, total_steps=1)
    assert {(p.dtype, p.device.type) for p in ref.model.parameters()} == {(torch.bfloat16, DEVICE)}
    ref_log_probs = ref.compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(ref_log_probs, fp32_cpu, atol=0.1, rtol=0.02)
    assert torch.equal(ref.compute_ref_log_prob(batch)["ref_log_prob"], ref_log_probs)


def test_weight_sync_reaches_the_engine_on_the_device(tiny_model_dir):
    """Guards the weight sync on the device: after an update, every tensor of the bfloat16 HF engine equals the
    actor's weight cast to bfloat16 (none missed, none left on another device), and the engine then generates
    from them."""
    cfg = make_config(tiny_model_dir, *BF16, "actor_rollout_ref.rollout.name=hf",
                      "actor_rollout_ref.rollout.dtype=bfloat16")
    worker = ActorRolloutWorker(cfg, total_steps=1)
    batch = random_batch(seed=19)
    worker.update_actor(add_targets(batch.union(worker.compute_log_prob(batch)), seed=19))
    stats = worker.sync_rollout_weights()
    engine_weights = worker.engine.model.state_dict()
    actor_weights = worker.model.state_dict()
    assert set(engine_weights) == set(actor_weights) and stats.tensors == len(actor_weights)
    for name, value in actor_weights.items():
        synced = engine_weights[name]
        assert synced.device.type == DEVICE and synced.dtype == torch.bfloat16, name
        assert torch.equal(synced, value.detach().to(device=synced.device, dtype=torch.bfloat16)), name
    outputs = worker.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=4, temperature=1.0, logprobs=True,
                                                                  seed=1))
    assert all(len(o.token_ids) == len(o.logprobs) > 0 for o in outputs)
