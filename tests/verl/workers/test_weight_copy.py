"""actor.compute_weight_copy (and critic.compute_weight_copy): the passes run on a bfloat16 copy of the weights, the
gradients land in the float32 weights, and the copy follows every optimiser step and checkpoint load
(verl/workers/weight_copy.py)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.fake_cuda import fake_cuda
from tests.verl.workers.worker_test_utils import (
    add_targets,
    assert_equal_parameters,
    gradients,
    make_config,
    parameters,
    random_batch,
    saved_and_resumed,
)
from verl.errors import ConfigError
from verl.workers.actor import ActorWorker
from verl.workers.critic import CriticWorker
from verl.workers.memory import count_parameters, estimate_memory
from verl.workers.weight_copy import WeightCopy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BF16 = "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16"
COPY = "actor_rollout_ref.actor.compute_weight_copy=true"
KL = ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1")
CRITIC_BF16, CRITIC_COPY = "critic.model.fsdp_config.dtype=bfloat16", "critic.compute_weight_copy=true"
GAE = "algorithm.adv_estimator=gae"


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(input_ids=ids).logits.float().logsumexp(-1).mean()


def test_gradients_of_two_micro_batches_sum_in_float32_into_the_trained_weights(tiny_model_dir):
    """Guards against a copy whose gradients are lost (a tied weight's second use, a hook that overwrites instead of
    adding) or summed in bfloat16: the float32 gradients equal the sum, in float32, of the gradients a bfloat16
    model computes for each micro-batch alone."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    copy = WeightCopy(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in copy.module.parameters())
    assert all(b.dtype == model.get_buffer(n).dtype for n, b in copy.module.named_buffers())  # rotary stays float32
    gen = torch.Generator().manual_seed(0)
    micro = [torch.randint(3, 300, (2, 9), generator=gen) for _ in range(2)]
    for ids in micro:
        loss_of(copy.module, ids).backward()
    assert all(p.grad is None for p in copy.module.parameters())  # freed once added in
    expected = {}
    for ids in micro:
        alone = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        for p in alone.parameters():
            p.data = p.data.to(torch.bfloat16)
        loss_of(alone, ids).backward()
        for name, p in alone.named_parameters():
            expected[name] = expected.get(name, 0) + p.grad.float()
    for name, p in model.named_parameters():
        assert p.grad.dtype == torch.float32, name
        torch.testing.assert_close(p.grad, expected[name], rtol=0, atol=0, msg=name)


def test_the_update_trains_the_float32_weights_and_the_copy_follows(tiny_model_dir):
    """Guards against a copy left at the initial weights after a step (the next pass would sample one policy and
    train another), against weights or optimiser moved to bfloat16, and against an update far from the autocast one
    (the same loss, within bfloat16 rounding)."""
    batch = add_targets(random_batch(seed=3), seed=3)
    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
    plain = ActorWorker(make_config(tiny_model_dir, BF16, *KL, micro), total_steps=2)
    copied = ActorWorker(make_config(tiny_model_dir, BF16, COPY, *KL, micro), total_steps=2)
    before = parameters(copied)
    metrics = [(plain.update_actor(batch), copied.update_actor(batch)) for _ in range(2)]
    for a, b in metrics:
        assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"], rel=0.05, abs=1e-3)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=0.05)
    grads_plain, grads_copied = gradients(plain), gradients(copied)
    for name, value in parameters(copied).items():
        assert value.dtype == torch.float32
        assert not torch.equal(value, before[name]), name  # trained
        cosine = torch.nn.functional.cosine_similarity(grads_copied[name].flatten(), grads_plain[name].flatten(), 0)
        assert cosine > 0.98, name
    for compute, master in copied.weight_copy.pairs:
        assert torch.equal(compute, master.detach().to(torch.bfloat16))
    state = copied.full_state_dict()
    assert all(t.dtype == torch.float32 for t in state.values())  # the rollout sync and export read float32


def test_checkpoint_load_refreshes_the_copy_and_the_next_update_is_identical(tiny_model_dir, tmp_path):
    """Guards against a resume whose copy keeps the fresh worker's initial weights: its next update would differ."""
    original, resumed = saved_and_resumed(make_config(tiny_model_dir, BF16, COPY, *KL), tmp_path / "actor")
    second = add_targets(random_batch(seed=9), seed=9)
    for (a, _), (b, _) in zip(original.weight_copy.pairs, resumed.weight_copy.pairs, strict=True):
        assert torch.equal(a, b)
    assert original.update_actor(second) == resumed.update_actor(second)
    assert_equal_parameters(original, resumed)


@pytest.mark.parametrize("overrides, named", [
    ((), "fsdp_config.dtype=float32"),
    ((BF16, "actor_rollout_ref.model.lora_rank=4"), "LoRA"),
    ((BF16, "actor_rollout_ref.actor.fsdp_config.param_offload=true"), "sharded"),
])
def test_the_copy_is_refused_where_it_cannot_work(tiny_model_dir, overrides, named):
    with pytest.raises(ConfigError, match="compute_weight_copy") as err:
        make_config(tiny_model_dir, COPY, *overrides)
    assert named in str(err.value)


def test_the_critics_copy_trains_its_float32_weights_follows_them_and_survives_a_resume(tiny_model_dir, tmp_path):
    """Guards against a critic whose passes ignore its copy or whose copy goes stale: its values and update stay
    within bfloat16 rounding of autocast's, its float32 weights train, the copy equals them after every step and
    after a checkpoint load (a resumed critic's next update is identical)."""
    micro = "critic.ppo_micro_batch_size_per_gpu=4"
    plain = CriticWorker(make_config(tiny_model_dir, GAE, CRITIC_BF16, micro), total_steps=4)
    cfg = make_config(tiny_model_dir, GAE, CRITIC_BF16, CRITIC_COPY, micro)
    copied = CriticWorker(cfg, total_steps=4)
    calls = {"copy": 0, "weights": 0}  # forward passes of each module: the passes must run on the copy
    copied.weight_copy.module.register_forward_hook(lambda *_: calls.__setitem__("copy", calls["copy"] + 1))
    copied.model.register_forward_hook(lambda *_: calls.__setitem__("weights", calls["weights"] + 1))
    batch = add_targets(random_batch(seed=6), seed=6)
    torch.testing.assert_close(copied.compute_values(batch)["values"], plain.compute_values(batch)["values"],
                               atol=0.02, rtol=0.02)
    before = parameters(copied)
    a, b = plain.update_critic(batch), copied.update_critic(batch)
    assert b["critic/vf_loss"] == pytest.approx(a["critic/vf_loss"], rel=0.02)
    assert b["critic/grad_norm"] == pytest.approx(a["critic/grad_norm"], rel=0.05)
    assert calls == {"copy": 4, "weights": 0}  # 2 micro-batches for the values, 2 for the update
    grads = gradients(plain)
    for name, value in parameters(copied).items():
        assert value.dtype == torch.float32 and not torch.equal(value, before[name]), name
        cosine = torch.nn.functional.cosine_similarity(copied.model.get_parameter(name).grad.flatten(),
                                                       grads[name].flatten(), 0)
        assert cosine > 0.98, name
    for compute, master in copied.weight_copy.pairs:
        assert torch.equal(compute, master.detach().to(torch.bfloat16))
    copied.save_checkpoint(str(tmp_path / "critic"))
    resumed = CriticWorker(cfg, total_steps=4)
    resumed.load_checkpoint(str(tmp_path / "critic"))
    second = add_targets(random_batch(seed=7), seed=7)
    assert copied.update_critic(second) == resumed.update_critic(second)
    assert_equal_parameters(copied, resumed)


@pytest.mark.parametrize("overrides, named", [
    ((), "critic.model.fsdp_config.dtype=float32"),
    ((CRITIC_BF16, "critic.model.fsdp_config.param_offload=true"), "sharded"),
])
def test_the_critics_copy_is_refused_where_it_cannot_work(tiny_model_dir, overrides, named):
    with pytest.raises(ConfigError, match="critic.compute_weight_copy") as err:
        make_config(tiny_model_dir, GAE, CRITIC_COPY, *overrides)
    assert named in str(err.value)


def test_the_memory_estimate_counts_each_copy_in_its_dtype(tiny_model_dir):
    """Guards against a start-up estimate that leaves a copy out: each adds 2 bytes per parameter in bfloat16."""
    total = count_parameters(make_config(tiny_model_dir))[0]
    base = (GAE, BF16, CRITIC_BF16)
    weights = {keys: estimate_memory(make_config(tiny_model_dir, *base, *keys)).weights
               for keys in [(), (COPY,), (CRITIC_COPY,), (COPY, CRITIC_COPY)]}
    assert weights[(COPY,)] - weights[()] == weights[(CRITIC_COPY,)] - weights[()] == 2 * total
    assert weights[(COPY, CRITIC_COPY)] - weights[()] == 4 * total


def test_the_copy_and_its_gradients_stay_on_the_models_device(tiny_model_dir):
    """Guards against a copy, a gradient or a refresh that crosses to the host on a GPU (tests/fake_cuda.py raises
    CUDA's error when an op mixes device and host tensors; it cannot show bfloat16 values on the device, so this
    checks devices and that the updates run, not numbers)."""
    with fake_cuda():
        worker = ActorWorker(make_config(tiny_model_dir, BF16, COPY, *KL, "trainer.device=cuda"), total_steps=2)
        for seed in (4, 5):
            metrics = worker.update_actor(add_targets(random_batch(seed=seed), seed=seed))
            assert math.isfinite(metrics["actor/grad_norm"])
        assert all(p.device.type == "cuda" for p in worker.weight_copy.module.parameters())
        assert all(p.device.type == "cuda" and p.grad.device.type == "cuda" for p in worker.model.parameters())


def test_the_critics_copy_and_its_gradients_stay_on_the_models_device(tiny_model_dir):
    """The critic's copy under tests/fake_cuda.py, as the actor's above: its value pass and two updates run on the
    device, and its copy and gradients stay there."""
    with fake_cuda():
        cfg = make_config(tiny_model_dir, GAE, CRITIC_BF16, CRITIC_COPY, "trainer.device=cuda")
        critic = CriticWorker(cfg, total_steps=2)
        for seed in (4, 5):
            batch = add_targets(random_batch(seed=seed), seed=seed)
            assert critic.compute_values(batch)["values"].shape == batch["responses"].shape
            assert math.isfinite(critic.update_critic(batch)["critic/grad_norm"])
        assert all(p.device.type == "cuda" for p in critic.weight_copy.module.parameters())
        assert all(p.device.type == "cuda" and p.grad.device.type == "cuda" for p in critic.model.parameters())
