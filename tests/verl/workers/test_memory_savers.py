"""LoRA, CPU offload, bfloat16 optimiser state and the start-up memory estimate, on the tiny real model.

Guards against: LoRA updates that move frozen base weights, a reference that is not the base model,
LoRA checkpoints that lose the adapters or their moments (or carry the base), merged exports or
engine syncs that differ from the trained adapter model, offload that changes the update, a
low-precision-state AdamW whose arithmetic is not AdamW's, and a memory estimate that miscounts
the parameters it is built on.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.verl.workers.worker_test_utils import (
    add_targets,
    assert_same_update,
    gradients,
    make_config,
    parameters,
    random_batch,
)
from verl.workers.actor import ActorWorker
from verl.workers.actor_rollout import ActorRolloutWorker
from verl.workers.memory import count_parameters, estimate_memory
from verl.workers.optim import LowPrecisionStateAdamW
from verl.workers.reference import RefWorker
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.optim.lr=0.05", "actor_rollout_ref.actor.use_kl_loss=true")


def _adapters(worker) -> dict[str, torch.Tensor]:
    return {n: p for n, p in parameters(worker).items() if "lora_" in n}


def _base(worker) -> dict[str, torch.Tensor]:
    return {n: p for n, p in parameters(worker).items() if "lora_" not in n}


def test_lora_step_trains_only_adapters_and_the_reference_is_the_base_model(tiny_model_dir):
    """Only adapter weights move; the actor's adapter-disabled log-probs equal a separate base
    reference model's before and after the update, while the actor's own log-probs move away."""
    cfg = make_config(tiny_model_dir, *LORA)
    worker = ActorWorker(cfg, total_steps=1)
    base_before, adapters_before = _base(worker), _adapters(worker)
    assert adapters_before and all(p.requires_grad == ("lora_" in n) for n, p in worker.model.named_parameters())
    batch = random_batch(seed=50)
    reference = RefWorker(make_config(tiny_model_dir), total_steps=1).compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(worker.compute_ref_log_prob(batch)["ref_log_prob"], reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(worker.compute_log_prob(batch)["old_log_probs"], reference, atol=1e-6, rtol=0)

    trained = add_targets(batch.union(worker.compute_log_prob(batch)).union(
        RefWorker(make_config(tiny_model_dir), total_steps=1).compute_ref_log_prob(batch)), seed=51)
    worker.update_actor(trained)
    assert all(torch.equal(p, base_before[n]) for n, p in _base(worker).items())
    assert any(not torch.equal(p, adapters_before[n]) for n, p in _adapters(worker).items())
    torch.testing.assert_close(worker.compute_ref_log_prob(batch)["ref_log_prob"], reference, atol=1e-6, rtol=0)
    assert not torch.allclose(worker.compute_log_prob(batch)["old_log_probs"], reference, atol=1e-3)


def test_lora_resume_restores_adapters_and_moments_without_the_base(tiny_model_dir, tmp_path):
    """A fresh LoRA worker loading the checkpoint makes the bit-identical next update; the checkpoint
    holds adapter tensors only (the base is the model directory's)."""
    cfg = make_config(tiny_model_dir, *LORA, "actor_rollout_ref.actor.use_kl_loss=false")
    first, second = add_targets(random_batch(seed=52), seed=52), add_targets(random_batch(seed=53), seed=53)
    original = ActorWorker(cfg, total_steps=4)
    original.update_actor(first)
    original.save_checkpoint(str(tmp_path / "actor"))
    saved = torch.distributed.checkpoint.FileSystemReader(str(tmp_path / "actor")).read_metadata()
    model_keys = {k.removeprefix("model.") for k in saved.state_dict_metadata if k.startswith("model.")}
    assert model_keys and all("lora_" in k for k in model_keys)
    resumed = ActorWorker(cfg, total_steps=4)
    resumed.load_checkpoint(str(tmp_path / "actor"))
    assert original.update_actor(second) == resumed.update_actor(second)
    for name, value in parameters(original).items():
        assert torch.equal(value, parameters(resumed)[name]), name


def test_lora_engine_and_merged_export_generate_like_the_adapter_model(tiny_model_dir, tmp_path):
    """After an update, the rank's engine (synced with merged weights) and the exported merged HF model
    both generate the greedy ids of the trained adapter model itself."""
    cfg = make_config(tiny_model_dir, *LORA, "actor_rollout_ref.actor.use_kl_loss=false",
                      "actor_rollout_ref.rollout.name=hf")
    worker = ActorRolloutWorker(cfg, total_steps=1)
    worker.update_actor(add_targets(random_batch(seed=54), seed=54))
    stats = worker.sync_rollout_weights()
    names = {n for n, _ in AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict().items()}
    assert stats.tensors == len(names)  # every HF weight, no adapter tensor
    worker.save_hf_model(str(tmp_path / "export"))
    prompts = [[5, 9, 17, 33], [40, 41], [7] * 6]
    greedy = SamplingParams(max_tokens=12, temperature=0)
    with torch.no_grad():
        adapter_ids = []
        for prompt in prompts:
            out = worker.model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
            adapter_ids.append(out[0, len(prompt):].tolist())
    exported = HFRollout(str(tmp_path / "export"))
    for engine in (worker.engine, exported):
        got = [o.token_ids for o in engine.generate(prompts, greedy)]
        # the engines stop at eos; the adapter model above was asked not to
        assert all(g == a[:len(g)] for g, a in zip(got, adapter_ids, strict=True)), (got, adapter_ids)
    assert set(AutoModelForCausalLM.from_pretrained(tmp_path / "export").state_dict()) == names


def test_cpu_offload_gives_the_same_update(tiny_model_dir):
    """FSDP2 with CPUOffloadPolicy (a process group of one is started for it) makes the update of the
    plain single-process actor."""
    batch = add_targets(random_batch(seed=55), seed=55)
    results = []
    started_here = not torch.distributed.is_initialized()
    for offload in ("false", "true"):
        worker = ActorWorker(make_config(tiny_model_dir, f"actor_rollout_ref.actor.fsdp_config.param_offload={offload}",
                                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"), total_steps=1)
        metrics = worker.update_actor(batch)
        full = worker.full_state_dict()
        named = {n: full[n] for n in parameters(worker)} if offload == "true" else parameters(worker)
        grads = {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in gradients(worker).items()}
        results.append((metrics, named, grads))
    if started_here:  # the offloading worker started a process group of one: leave none behind
        torch.distributed.destroy_process_group()
    assert_same_update(*results)


def test_low_precision_state_adamw_is_adamw():
    """With float32 state the optimiser reproduces torch's AdamW over several steps; with bfloat16
    state it stores bf16 moments and stays within bf16 rounding of it."""
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(6, 5, generator=gen)
    grads = [torch.randn(6, 5, generator=gen) for _ in range(5)]
    finals = {}
    for name in ("torch", "float32", "bfloat16"):
        param = torch.nn.Parameter(start.clone())
        kw = {"lr": 0.01, "weight_decay": 0.1}
        opt = torch.optim.AdamW([param], **kw) if name == "torch" else \
            LowPrecisionStateAdamW([param], state_dtype=getattr(torch, name), **kw)
        for grad in grads:
            param.grad = grad.clone()
            opt.step()
        finals[name] = param.detach()
        if name == "bfloat16":
            assert opt.state[param]["exp_avg"].dtype == torch.bfloat16
    torch.testing.assert_close(finals["float32"], finals["torch"], atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(finals["bfloat16"], finals["torch"], atol=2e-3, rtol=0)
    assert not torch.equal(finals["bfloat16"], finals["torch"])


def test_memory_estimate_counts_the_real_parameters(tiny_model_dir):
    """The estimate's parameter counts equal the loaded model's (all, and peft's trainable adapters),
    and offload moves the actor's weights and optimiser from the device to the host."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    total, trained, _ = count_parameters(make_config(tiny_model_dir))
    assert total == trained == sum(p.numel() for p in model.parameters())
    worker = ActorWorker(make_config(tiny_model_dir, *LORA), total_steps=1)
    total, trained, _ = count_parameters(make_config(tiny_model_dir, *LORA))
    assert total == sum(p.numel() for p in worker.model.parameters())
    assert trained == sum(p.numel() for p in worker.model.parameters() if p.requires_grad)
    plain = estimate_memory(make_config(tiny_model_dir))
    offloaded = estimate_memory(make_config(tiny_model_dir, "actor_rollout_ref.actor.fsdp_config.param_offload=true"))
    assert offloaded.host > 0 == plain.host
    assert offloaded.device_total == pytest.approx(plain.device_total - offloaded.host)


def test_memory_estimate_takes_the_larger_of_the_actors_and_the_critics_micro_batch(tiny_model_dir):
    """Guards against an estimate that counts only the actor's micro-batch when the critic's (GAE) is larger: its
    rows, or its token budget's rows, set the activations then (no vocabulary logits); a smaller one changes
    nothing, and GRPO (no critic) ignores the critic's keys."""
    gae, grpo = "algorithm.adv_estimator=gae", "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=2"
    act = {name: estimate_memory(make_config(tiny_model_dir, gae, *keys), tokens=100, response_tokens=50).activations
           for name, keys in {"small": ["critic.ppo_micro_batch_size_per_gpu=1"],
                              "same": [], "large": ["critic.ppo_micro_batch_size_per_gpu=64"],
                              "budget": ["critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=6400"],
                              "grpo": [*grpo.split(), "critic.ppo_micro_batch_size_per_gpu=64"]}.items()}
    assert act["small"] == act["same"] == act["grpo"]
    assert act["large"] > act["same"]
    assert act["budget"] == act["large"]  # 6400 tokens // 100 a row = 64 rows
