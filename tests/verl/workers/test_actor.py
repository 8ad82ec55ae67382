"""The actor and reference workers: log-prob columns, state masking, gradient accumulation, checkpoints."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM
from worker_test_utils import (
    add_targets,
    assert_equal_parameters,
    assert_same_update,
    capture_outputs,
    gradients,
    make_config,
    parameters,
    perturb_masked,
    random_batch,
    real_vocab_batch,
)

from verl.protocol import Batch
from verl.workers.actor import ActorWorker
from verl.workers.reference import RefWorker

FULL_LOSS = ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1",
             "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.clip_ratio_c=3.0")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def plain_log_probs(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, unpadded: log softmax at the positions that predict each response token; and the entropy."""
    log_probs = torch.zeros(batch["responses"].shape)
    entropies = torch.zeros(batch["responses"].shape)
    P = batch["prompts"].shape[1]
    for i in range(len(batch)):
        prompt = batch["input_ids"][i, :P][batch["attention_mask"][i, :P].bool()]
        n = int(batch["response_mask"][i].sum())
        ids = torch.cat([prompt, batch["responses"][i, :n]])
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0]
        for t in range(n):
            dist = torch.log_softmax(logits[len(prompt) - 1 + t], dim=-1)
            log_probs[i, t] = dist[ids[len(prompt) + t]]
            entropies[i, t] = -(dist.exp() * dist).sum()
    return log_probs, entropies


def test_log_probs_and_entropy_match_a_plain_per_row_loop(tiny_model_dir):
    """Guards against reading the wrong logit columns (off by one at P-1), padding leaking into
    real tokens, and non-zero values left at response padding."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.rollout.log_prob_micro_batch_size=3")
    batch = random_batch(seed=0)
    out = ActorWorker(cfg, total_steps=1).compute_log_prob(batch)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected_lp, expected_ent = plain_log_probs(model, batch)
    torch.testing.assert_close(out["old_log_probs"], expected_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["entropy"], expected_ent, atol=1e-4, rtol=1e-5)
    assert torch.all(out["old_log_probs"][batch["response_mask"] == 0] == 0)


def test_reference_matches_actor_before_training_and_stays_frozen(tiny_model_dir):
    """Guards against a reference that is not the actor's initial policy or that moves with the actor."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=48")
    batch = random_batch(seed=1)
    actor, ref = ActorWorker(cfg, total_steps=1), RefWorker(cfg, total_steps=1)
    before = ref.compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(before, actor.compute_log_prob(batch)["old_log_probs"], atol=1e-6, rtol=0)
    actor.update_actor(add_targets(batch, seed=2))
    assert not any(p.requires_grad for p in ref.model.parameters())
    assert torch.equal(ref.compute_ref_log_prob(batch)["ref_log_prob"], before)


def test_first_update_sees_ratio_one(tiny_model_dir):
    """Guards against dropout or a different forward path between compute_log_prob and the update:
    on the first mini-batch new and old log-probs must agree (ppo_kl 0, nothing clipped)."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.rollout.log_prob_micro_batch_size=3",
                      "actor_rollout_ref.actor.ppo_micro_batch_size=2")
    actor = ActorWorker(cfg, total_steps=1)
    batch = random_batch(seed=3)
    batch = add_targets(batch.union(actor.compute_log_prob(batch)), seed=3)
    metrics = actor.update_actor(batch)
    assert abs(metrics["actor/ppo_kl"]) < 1e-6
    assert metrics["actor/pg_clipfrac"] == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_targets_at_masked_positions_do_not_change_the_update(tiny_model_dir, mode):
    """State masking: advantages, old and reference log-probs at inserted/padding positions must have
    exactly zero influence (a masked token's gradient is exactly zero), under every aggregation."""
    cfg = make_config(tiny_model_dir, f"actor_rollout_ref.actor.loss_agg_mode={mode}", *FULL_LOSS,
                      "actor_rollout_ref.actor.ppo_micro_batch_size=4")
    batch = add_targets(random_batch(seed=4), seed=4)
    assert (batch["info_mask"][batch["response_mask"] == 1] == 0).any(), "the batch must contain inserted tokens"
    a, b = ActorWorker(cfg, total_steps=1), ActorWorker(cfg, total_steps=1)
    metrics_a, metrics_b = a.update_actor(batch), b.update_actor(perturb_masked(batch, seed=5))
    assert metrics_a == metrics_b
    assert_equal_parameters(a, b)


@pytest.mark.parametrize("vocab", ["tiny", "qwen"])
def test_logits_at_inserted_positions_get_exactly_zero_gradient(request, vocab):
    """With state masking on, the actor loss (PPO + entropy + KL) must send exactly zero gradient
    into the logits of tokens inserted by the environment and of padding, and some elsewhere; also on
    agent-loop trajectories of Qwen2.5's real vocabulary (multi-token tags, blocks that start where a
    re-tokenisation would merge them with the sampled text)."""
    if vocab == "tiny":
        model_dir, batch = request.getfixturevalue("tiny_model_dir"), random_batch(seed=6)
    else:
        model_dir = request.getfixturevalue("qwen_model_dir")
        batch = real_vocab_batch(request.getfixturevalue("qwen_tokenizer"))
    cfg = make_config(model_dir, *FULL_LOSS)
    batch = add_targets(batch, seed=6)
    actor = ActorWorker(cfg, total_steps=1)
    outputs = capture_outputs(actor.model.lm_head)
    actor.update_actor(batch)
    (logits,) = outputs  # one micro-batch: [B, R + 1, V] (the LM head runs on the response columns only)
    grad = logits.grad[:, :-1]  # [B, R, V]: row i, column t predicts response token t
    masked = batch["loss_mask"] == 0
    assert torch.all(grad[masked] == 0)
    assert torch.all(grad[~masked].abs().sum(-1) > 0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batch_accumulation_equals_one_full_micro_batch(tiny_model_dir, mode):
    """Guards against per-micro-batch normalisation (mean of means): accumulating 4 micro-batches of 2
    rows, or token-budget micro-batches, must give the update of one 8-row micro-batch."""
    common = (f"actor_rollout_ref.actor.loss_agg_mode={mode}", *FULL_LOSS, "actor_rollout_ref.actor.ppo_epochs=2")
    batch = add_targets(random_batch(seed=7), seed=7)
    variants = {
        "full": make_config(tiny_model_dir, *common),
        "micro2": make_config(tiny_model_dir, *common, "actor_rollout_ref.actor.ppo_micro_batch_size=2"),
        "dynamic": make_config(tiny_model_dir, *common, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                               "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40"),
    }
    results = {}
    for name, cfg in variants.items():
        worker = ActorWorker(cfg, total_steps=1)
        results[name] = (worker.update_actor(batch), parameters(worker), gradients(worker))
    assert_same_update(results["micro2"], results["full"])
    assert_same_update(results["dynamic"], results["full"])


def test_checkpoint_then_fresh_worker_gives_identical_next_update(tiny_model_dir, tmp_path):
    """Guards against a resume that loses optimiser moments or the LR schedule position: a fresh
    worker loading the checkpoint must make bit-identical next updates."""
    cfg = make_config(tiny_model_dir, *FULL_LOSS, "actor_rollout_ref.actor.lr_warmup_steps_ratio=0.5")
    first, second = add_targets(random_batch(seed=8), seed=8), add_targets(random_batch(seed=9), seed=9)
    original = ActorWorker(cfg, total_steps=4)
    original.update_actor(first)
    original.save_checkpoint(str(tmp_path / "actor"))
    resumed = ActorWorker(cfg, total_steps=4)
    resumed.load_checkpoint(str(tmp_path / "actor"))
    assert original.update_actor(second) == resumed.update_actor(second)
    assert_equal_parameters(original, resumed)
    state = original.full_state_dict()
    assert set(state) >= {name for name, _ in original.model.named_parameters()}
    assert all(t.device.type == "cpu" for t in state.values())


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir):
    """Guards against checkpointing silently off (transformers only runs it in train mode) or changing the math."""
    batch = add_targets(random_batch(seed=17), seed=17)
    results = []
    for flag in ("false", "true"):
        cfg = make_config(tiny_model_dir, f"actor_rollout_ref.model.enable_gradient_checkpointing={flag}",
                          "actor_rollout_ref.actor.ppo_micro_batch_size=4")
        worker = ActorWorker(cfg, total_steps=1)
        assert worker.model.is_gradient_checkpointing == (flag == "true")
        results.append((worker.update_actor(batch), parameters(worker), gradients(worker)))
    assert_same_update(*results)


def test_bfloat16_compute_keeps_float32_weights_and_close_log_probs(tiny_model_dir):
    """Guards against bf16 AdamW state (weights must stay float32 under rollout.dtype=bfloat16) and a
    broken autocast path; bf16 log-probs stay within bf16 rounding of the float32 ones."""
    batch = random_batch(seed=18)
    fp32 = ActorWorker(make_config(tiny_model_dir), total_steps=1).compute_log_prob(batch)["old_log_probs"]
    worker = ActorWorker(make_config(tiny_model_dir, "actor_rollout_ref.rollout.dtype=bfloat16"), total_steps=1)
    bf16 = worker.compute_log_prob(batch)["old_log_probs"]
    assert all(p.dtype == torch.float32 for p in worker.model.parameters())
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, fp32, atol=0.1, rtol=0.02)
    metrics = worker.update_actor(add_targets(batch.union(Batch({"old_log_probs": bf16})), seed=18))
    assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
    ref = RefWorker(make_config(tiny_model_dir, "actor_rollout_ref.rollout.dtype=bfloat16"), total_steps=1)
    assert next(ref.model.parameters()).dtype == torch.bfloat16
    torch.testing.assert_close(ref.compute_ref_log_prob(batch)["ref_log_prob"], fp32, atol=0.1, rtol=0.02)
