"""The actor and reference workers: log-prob columns, state masking, gradient accumulation, checkpoints."""

from __future__ import annotations

import math
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.verl.workers.worker_test_utils import (
    PAD_ID,
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
    saved_and_resumed,
)
from verl.algorithms.core_algos import rollout_mismatch, truncated_is_weights
from verl.config import recomputes_old_log_probs
from verl.protocol import Batch
from verl.utils.seq import pack_trajectories
from verl.workers.actor import ActorWorker
from verl.workers.reference import RefWorker
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

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
    real tokens, and non-zero values left at response padding or at the inserted tokens (which are not scored:
    verl/workers/scored_tokens.py)."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3")
    batch = random_batch(seed=0)
    out = ActorWorker(cfg, total_steps=1).compute_log_prob(batch)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected_lp, expected_ent = plain_log_probs(model, batch)
    scored = batch["loss_mask"].float()  # [B, R]: the policy's tokens (state masking)
    assert 0 < scored.sum() < batch["response_mask"].sum()
    torch.testing.assert_close(out["old_log_probs"], expected_lp * scored, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["entropy"], expected_ent * scored, atol=1e-4, rtol=1e-5)


def test_reference_matches_actor_before_training_and_stays_frozen(tiny_model_dir):
    """Guards against a reference that is not the actor's initial policy or that moves with the actor, and against
    token-budget micro-batches (rows regrouped by length) handing the log-probs back out of batch order."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=48")
    batch = random_batch(seed=1)
    actor, ref = ActorWorker(cfg, total_steps=1), RefWorker(cfg, total_steps=1)
    before = ref.compute_ref_log_prob(batch)["ref_log_prob"]
    in_rows = RefWorker(make_config(tiny_model_dir), total_steps=1).compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(before, in_rows, atol=1e-5, rtol=0)
    torch.testing.assert_close(before, actor.compute_log_prob(batch)["old_log_probs"], atol=1e-6, rtol=0)
    actor.update_actor(add_targets(batch, seed=2))
    assert not any(p.requires_grad for p in ref.model.parameters())
    assert torch.equal(ref.compute_ref_log_prob(batch)["ref_log_prob"], before)


def test_first_update_sees_ratio_one(tiny_model_dir):
    """Guards against dropout or a different forward path between compute_log_prob and the update:
    on the first mini-batch new and old log-probs must agree (ppo_kl 0, nothing clipped)."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
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
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    batch = add_targets(random_batch(seed=4), seed=4)
    assert (batch["info_mask"][batch["response_mask"] == 1] == 0).any(), "the batch must contain inserted tokens"
    a, b = ActorWorker(cfg, total_steps=1), ActorWorker(cfg, total_steps=1)
    metrics_a, metrics_b = a.update_actor(batch), b.update_actor(perturb_masked(batch, seed=5))
    assert metrics_a == metrics_b
    assert_equal_parameters(a, b)


@pytest.mark.parametrize("vocab", ["tiny", "qwen"])
def test_logits_at_inserted_positions_get_exactly_zero_gradient(request, vocab):
    """With state masking on, the actor loss (PPO + entropy + KL) must send no gradient into the logits of tokens
    inserted by the environment and of padding (the LM head does not compute them: scored_tokens.py), exactly zero
    into those of a row whose loss is masked out (scored for rollout/*), and some into every trained token's; also
    on agent-loop trajectories of Qwen2.5's real vocabulary (multi-token tags, blocks that start where a
    re-tokenisation would merge them with the sampled text)."""
    if vocab == "tiny":
        model_dir, batch = request.getfixturevalue("tiny_model_dir"), random_batch(seed=6)
    else:
        model_dir = request.getfixturevalue("qwen_model_dir")
        batch = real_vocab_batch(request.getfixturevalue("qwen_tokenizer"))
    # every row in full (one LM head call to read); the shared-prefix forward's gradients equal these
    # (test_prefix_sharing.py)
    cfg = make_config(model_dir, *FULL_LOSS, "actor_rollout_ref.actor.share_prompt_prefix=false")
    batch = add_targets(batch, seed=6)
    batch.tensors["loss_mask"] = batch["loss_mask"].clone()
    batch.tensors["loss_mask"][0] = 0  # as the overlong filter masks a row
    actor = ActorWorker(cfg, total_steps=1)
    outputs = capture_outputs(actor.model.lm_head)
    actor.update_actor(batch)
    (logits,) = outputs  # one micro-batch: [1, n, V], the scored tokens in row-major order
    policy = (batch["response_mask"] * batch["info_mask"]).bool()  # [B, R]: sampled by the policy
    assert logits.shape[:2] == (1, int(policy.sum())) and policy.sum() < batch["response_mask"].sum()
    trained = batch["loss_mask"].bool()[policy]  # [n]
    grad = logits.grad[0]  # [n, V]
    assert torch.all(grad[~trained] == 0) and (~trained).any()
    assert torch.all(grad[trained].abs().sum(-1) > 0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batch_accumulation_equals_one_full_micro_batch(tiny_model_dir, mode):
    """Guards against per-micro-batch normalisation (mean of means): accumulating 4 micro-batches of 2
    rows, or token-budget micro-batches, must give the update of one 8-row micro-batch."""
    common = (f"actor_rollout_ref.actor.loss_agg_mode={mode}", *FULL_LOSS, "actor_rollout_ref.actor.ppo_epochs=2")
    batch = add_targets(random_batch(seed=7), seed=7)
    variants = {
        "full": make_config(tiny_model_dir, *common),
        "micro2": make_config(tiny_model_dir, *common, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"),
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
    original, resumed = saved_and_resumed(cfg, tmp_path / "actor")
    second = add_targets(random_batch(seed=9), seed=9)
    assert original.update_actor(second) == resumed.update_actor(second)
    assert_equal_parameters(original, resumed)
    state = original.full_state_dict()
    assert set(state) >= {name for name, _ in original.model.named_parameters()}
    assert all(t.device.type == "cpu" for t in state.values())



def test_verl_cosine_schedule_keys_reach_the_actor_and_the_critic(tiny_model_dir):
    """Guards against optim.warmup_style / verl's newer optim.lr_scheduler_type being accepted and ignored (the
    learning rate constant): three one-step updates follow half a cosine from lr down towards min_lr_ratio x lr."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.rollout.n=1",
                      "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
                      "actor_rollout_ref.actor.optim.min_lr_ratio=0.5", "critic.optim.warmup_style=cosine")
    assert cfg.actor_rollout_ref.actor.optim.warmup_style == cfg.critic.optim.warmup_style == "cosine"
    worker = ActorWorker(cfg, total_steps=3)
    lrs = [worker.update_actor(add_targets(random_batch(seed=s), seed=s))["actor/lr"] for s in range(3)]
    assert lrs == pytest.approx([1e-3, 1e-3 * (0.5 + 0.5 * 0.75), 1e-3 * (0.5 + 0.5 * 0.25)])

def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir):
    """Guards against checkpointing silently off (transformers only runs it in train mode) or changing the math."""
    batch = add_targets(random_batch(seed=17), seed=17)
    results = []
    for flag in ("false", "true"):
        cfg = make_config(tiny_model_dir, f"actor_rollout_ref.model.enable_gradient_checkpointing={flag}",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
        worker = ActorWorker(cfg, total_steps=1)
        assert worker.model.is_gradient_checkpointing == (flag == "true")
        results.append((worker.update_actor(batch), parameters(worker), gradients(worker)))
    assert_same_update(*results)


def test_bfloat16_compute_keeps_float32_weights_and_close_log_probs(tiny_model_dir):
    """Guards against bf16 AdamW state (weights must stay float32 under actor.fsdp_config.dtype=bfloat16) and a
    broken autocast path; bf16 log-probs stay within bf16 rounding of the float32 ones. The reference follows
    the actor's training dtype by default and is loaded in it."""
    batch = random_batch(seed=18)
    fp32 = ActorWorker(make_config(tiny_model_dir), total_steps=1).compute_log_prob(batch)["old_log_probs"]
    bf16_cfg = make_config(tiny_model_dir, "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16")
    worker = ActorWorker(bf16_cfg, total_steps=1)
    assert worker.dtype == torch.bfloat16
    bf16 = worker.compute_log_prob(batch)["old_log_probs"]
    assert all(p.dtype == torch.float32 for p in worker.model.parameters())
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, fp32, atol=0.1, rtol=0.02)
    metrics = worker.update_actor(add_targets(batch.union(Batch({"old_log_probs": bf16})), seed=18))
    assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
    ref = RefWorker(bf16_cfg, total_steps=1)
    assert next(ref.model.parameters()).dtype == torch.bfloat16
    torch.testing.assert_close(ref.compute_ref_log_prob(batch)["ref_log_prob"], fp32, atol=0.1, rtol=0.02)


def test_each_worker_reads_its_own_precision_key(tiny_model_dir):
    """Guards against rollout.dtype setting the training dtype (it did: a bf16 engine made the actor, critic and
    reference compute in bf16 too): each worker computes in its own section's dtype, the engine in rollout.dtype."""
    from verl.workers.actor_rollout import ActorRolloutWorker
    from verl.workers.critic import CriticWorker

    def dtypes(*overrides: str) -> tuple[torch.dtype, ...]:
        cfg = make_config(tiny_model_dir, *overrides)
        actor = ActorRolloutWorker(cfg, total_steps=1)
        return (actor.dtype, actor.engine_dtype, CriticWorker(cfg, total_steps=1).dtype,
                RefWorker(cfg, total_steps=1).dtype)

    f32, bf16 = torch.float32, torch.bfloat16
    assert dtypes("actor_rollout_ref.rollout.dtype=bfloat16") == (f32, bf16, f32, f32)
    assert dtypes("actor_rollout_ref.actor.fsdp_config.dtype=bfloat16") == (bf16, f32, f32, bf16)
    assert dtypes("critic.model.fsdp_config.dtype=bfloat16", "actor_rollout_ref.ref.fsdp_config.dtype=bfloat16") \
        == (f32, f32, bf16, bf16)


def engine_batch(engine: HFRollout, seed: int) -> Batch:
    """8 trajectories sampled by ``engine`` (temperature 1, with its log-probs), packed as the trainer packs them."""
    gen = random.Random(seed)
    prompts = [[gen.randrange(3, 300) for _ in range(gen.randint(2, 8))] for _ in range(8)]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=10, temperature=1.0, logprobs=True, seed=seed))
    responses = [out.token_ids for out in outputs]
    tensors = pack_trajectories(prompts, responses, [[1] * len(r) for r in responses], PAD_ID,
                                [out.logprobs for out in outputs])
    tensors["loss_mask"] = tensors["response_mask"] * tensors["info_mask"]  # 1 = sampled by the policy (trained)
    return Batch(tensors)


def test_hf_engine_in_float32_gives_tis_weights_of_one(tiny_model_dir):
    """Guards against engine log-probs read at the wrong step or under the sampling temperature: the fp32 HF
    engine samples from exactly the trainer's distribution, so the mismatch is ~0 and every TIS weight is 1."""
    engine = HFRollout(str(tiny_model_dir), dtype="float32")
    batch = engine_batch(engine, seed=11)
    actor = ActorWorker(make_config(tiny_model_dir), total_steps=1)
    old = actor.compute_log_prob(batch)["old_log_probs"]
    mask = batch["loss_mask"]
    mismatch = rollout_mismatch(old, batch["rollout_log_probs"], mask)
    assert mismatch["logprob_diff_max"] < 1e-4 and mismatch["kl_k3"] < 1e-8
    weights = truncated_is_weights(old, batch["rollout_log_probs"], cap=2.0)
    torch.testing.assert_close(weights[mask == 1], torch.ones(int(mask.sum())), atol=1e-4, rtol=0)


def test_perturbed_engine_gives_capped_tis_weights_and_the_expected_gradient(tiny_model_dir):
    """Guards against TIS weights applied to the wrong tokens, not capped, or differentiated through: an
    engine whose weights are perturbed samples off-policy; the actor's gradient must equal
    -(1/N) sum_t min(pi_old / pi_rollout, C) A_t grad log pi(y_t), computed here row by row."""
    engine = HFRollout(str(tiny_model_dir), dtype="float32")
    gen = torch.Generator().manual_seed(0)
    engine.sync_weights((name, t + 0.05 * torch.randn(t.shape, generator=gen))
                        for name, t in engine.model.state_dict().items())
    batch = engine_batch(engine, seed=12)
    cap = 1.2
    cfg = make_config(tiny_model_dir, f"actor_rollout_ref.actor.tis_cap={cap}",
                      "actor_rollout_ref.actor.grad_clip=null")
    actor = ActorWorker(cfg, total_steps=1)
    batch = add_targets(batch.union(actor.compute_log_prob(batch)), seed=12)
    mask = batch["loss_mask"].bool()
    log_ratio = (batch["old_log_probs"] - batch["rollout_log_probs"])[mask]
    assert 0 < float((log_ratio >= math.log(cap)).float().mean()) < 1, "some weights capped, some not"
    metrics = actor.update_actor(batch)
    weights = torch.exp(log_ratio).clamp(max=cap)
    assert metrics["actor/tis_weight_mean"] == pytest.approx(float(weights.mean()), rel=1e-5)
    assert metrics["actor/tis_capped_frac"] == pytest.approx(float((log_ratio >= math.log(cap)).float().mean()))

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    P, count = batch["prompts"].shape[1], float(mask.sum())
    loss = 0.0
    for i in range(len(batch)):
        prompt = batch["input_ids"][i, :P][batch["attention_mask"][i, :P].bool()]
        n = int(batch["response_mask"][i].sum())
        ids = torch.cat([prompt, batch["responses"][i, :n]])
        dist = torch.log_softmax(model(input_ids=ids[None]).logits[0], dim=-1)
        for t in range(n):
            w = min(math.exp(float(batch["old_log_probs"][i, t] - batch["rollout_log_probs"][i, t])), cap)
            loss = loss - w * float(batch["advantages"][i, t]) * dist[len(prompt) - 1 + t, ids[len(prompt) + t]]
    (loss / count).backward()
    expected = {name: p.grad for name, p in model.named_parameters()}
    for name, grad in gradients(actor).items():
        torch.testing.assert_close(grad, expected[name], atol=2e-6, rtol=1e-3, msg=name)


def test_non_finite_loss_never_reaches_the_weights(tiny_model_dir):
    """Guards against a NaN advantage on one policy token writing NaN into every weight (and Adam's moments):
    the optimiser step is skipped and counted, and the next finite update goes through."""
    actor = ActorWorker(make_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"), total_steps=2)
    batch = add_targets(random_batch(seed=13), seed=13)
    poisoned = Batch(dict(batch.tensors))
    row, col = (batch["loss_mask"][:4] == 1).nonzero()[0].tolist()  # a policy token of the first mini-batch
    poisoned.tensors["advantages"] = batch["advantages"].clone()
    poisoned.tensors["advantages"][row, col] = float("nan")
    before = parameters(actor)
    metrics = actor.update_actor(poisoned)
    assert metrics["actor/skipped_updates"] == 1 and metrics["actor/nonfinite_loss"] == 1
    assert metrics["actor/nonfinite_grad_norm"] == 1  # the NaN reached the gradient, never the weights
    reference = ActorWorker(make_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"), total_steps=2)
    reference.update_actor(Batch({k: v[4:] for k, v in batch.tensors.items()}))  # only the clean mini-batch
    assert all(torch.isfinite(p).all() for p in parameters(actor).values())
    assert any(not torch.equal(before[n], p) for n, p in parameters(actor).items())
    assert_equal_parameters(actor, reference)
    assert actor.update_actor(batch)["actor/skipped_updates"] == 0


def test_on_policy_update_without_the_old_log_prob_pass_is_the_same_update(tiny_model_dir):
    """Guards the skipped pass (config.recomputes_old_log_probs): with one epoch over one mini-batch, an update whose
    old log-probs come from its own (detached) forward pass equals the update after a separate no-grad pass, in loss,
    gradients, weights, TIS weights and the rollout/* mismatch; a fused old log-prob left attached to the graph
    doubles the policy gradient and fails here."""
    engine = HFRollout(str(tiny_model_dir), dtype="float32")
    gen = torch.Generator().manual_seed(1)
    engine.sync_weights((name, t + 0.05 * torch.randn(t.shape, generator=gen))
                        for name, t in engine.model.state_dict().items())  # off the trainer's weights: TIS bites
    batch = add_targets(engine_batch(engine, seed=13), seed=13)
    batch = Batch({k: v for k, v in batch.tensors.items() if k != "old_log_probs"}, dict(batch.non_tensors))
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.actor.tis_cap=1.2", "actor_rollout_ref.actor.grad_clip=null",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3", *FULL_LOSS[2:])
    assert not recomputes_old_log_probs(cfg)
    assert recomputes_old_log_probs(make_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=4"))
    assert recomputes_old_log_probs(make_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_epochs=2"))
    assert recomputes_old_log_probs(make_config(tiny_model_dir, "algorithm.use_kl_in_reward=true"))

    separate, fused = ActorWorker(cfg, total_steps=1), ActorWorker(cfg, total_steps=1)
    with_pass = batch.union(separate.compute_log_prob(batch))
    metrics_pass = separate.update_actor(with_pass)
    metrics_fused = fused.update_actor(batch)
    mismatch = rollout_mismatch(with_pass["old_log_probs"], batch["rollout_log_probs"], batch["loss_mask"])
    assert metrics_fused.pop("actor/rollout_logprob_diff_mean") == pytest.approx(mismatch["logprob_diff_mean"],
                                                                                rel=1e-5)
    assert metrics_fused.pop("actor/rollout_logprob_diff_max") == pytest.approx(mismatch["logprob_diff_max"],
                                                                               rel=1e-5)
    assert metrics_fused.pop("actor/rollout_kl_k3") == pytest.approx(mismatch["kl_k3"], rel=1e-4, abs=1e-9)
    assert metrics_pass["actor/tis_capped_frac"] > 0
    assert_same_update((metrics_pass, parameters(separate), gradients(separate)),
                       (metrics_fused, parameters(fused), gradients(fused)))
