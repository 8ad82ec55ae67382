"""The critic worker: value columns, state masking in the value loss, gradient accumulation (rows or token
budget), checkpoints."""

from __future__ import annotations

import pytest
import torch

from tests.verl.workers.worker_test_utils import (
    add_targets,
    assert_equal_parameters,
    assert_same_update,
    capture_outputs,
    gradients,
    make_config,
    parameters,
    perturb_masked,
    random_batch,
)
from verl.config import computes_values_in_update
from verl.protocol import Batch
from verl.workers.critic import CriticWorker
from verl.workers.model_utils import micro_batches

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_values_match_a_plain_per_row_loop(tiny_model_dir):
    """Guards against reading values at the wrong columns: values[:, t] is the head's output at the
    state before response token t (column P-1+t of the unpadded row), 0 where loss_mask is 0."""
    cfg = make_config(tiny_model_dir, "critic.ppo_micro_batch_size_per_gpu=3")
    critic = CriticWorker(cfg, total_steps=1)
    batch = random_batch(seed=10)
    values = critic.compute_values(batch)["values"]
    P = batch["prompts"].shape[1]
    expected = torch.zeros(values.shape)
    for i in range(len(batch)):
        prompt = batch["input_ids"][i, :P][batch["attention_mask"][i, :P].bool()]
        n = int(batch["response_mask"][i].sum())
        ids = torch.cat([prompt, batch["responses"][i, :n]])
        with torch.no_grad():
            out = critic.model(input_ids=ids[None]).logits[0, :, 0]  # [len]
        for t in range(n):
            expected[i, t] = out[len(prompt) - 1 + t] * batch["loss_mask"][i, t]
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)


def test_token_budget_values_come_back_in_batch_order(tiny_model_dir):
    """Guards against the critic's token-budget micro-batches (rows regrouped by length, longest first) handing the
    values back out of batch order: they equal the fixed-row pass's, with the actor's budget (null) or its own."""
    rows = CriticWorker(make_config(tiny_model_dir, "critic.ppo_micro_batch_size_per_gpu=3"), total_steps=1)
    batch = random_batch(seed=10)
    expected = rows.compute_values(batch)["values"]
    actors = ("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=48")
    for keys in (actors, ("critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=40")):
        critic = CriticWorker(make_config(tiny_model_dir, *keys), total_steps=1)
        assert critic.max_tokens in (48, 40)
        micros = micro_batches(batch, 8, critic.max_tokens)
        assert [i for group in micros.rows for i in group] != list(range(len(batch)))  # really regrouped
        torch.testing.assert_close(critic.compute_values(batch)["values"], expected, atol=1e-5, rtol=0)
    off = make_config(tiny_model_dir, "actor_rollout_ref.actor.use_dynamic_bsz=true", "critic.use_dynamic_bsz=false")
    assert CriticWorker(off, total_steps=1).max_tokens is None


def test_targets_at_masked_positions_do_not_change_the_critic_update(tiny_model_dir):
    """State masking: returns and old values at inserted/padding positions must have exactly zero
    influence on the critic's update."""
    cfg = make_config(tiny_model_dir, "critic.ppo_micro_batch_size_per_gpu=4", "critic.cliprange_value=0.2")
    batch = add_targets(random_batch(seed=11), seed=11)
    a, b = CriticWorker(cfg, total_steps=1), CriticWorker(cfg, total_steps=1)
    metrics_a, metrics_b = a.update_critic(batch), b.update_critic(perturb_masked(batch, seed=12))
    assert metrics_a == metrics_b
    assert_equal_parameters(a, b)


def test_value_head_outputs_at_inserted_positions_get_exactly_zero_gradient(tiny_model_dir):
    """With state masking on, the critic loss must send exactly zero gradient into the value
    predicted for inserted tokens and padding, and some into every policy token's value."""
    cfg = make_config(tiny_model_dir, "critic.cliprange_value=100")  # no clipping: every policy token has gradient
    batch = add_targets(random_batch(seed=13), seed=13)
    critic = CriticWorker(cfg, total_steps=1)
    outputs = capture_outputs(critic.model.score)
    critic.update_critic(batch)
    (scores,) = outputs  # [B, W, 1], W = P + R less the all-padding prompt columns
    R = batch["responses"].shape[1]
    grad = scores.grad[:, -R - 1:-1, 0]  # [B, R]: the value before response token t
    masked = batch["loss_mask"] == 0
    assert torch.all(grad[masked] == 0)
    assert torch.all(grad[~masked] != 0)


def test_critic_micro_batch_accumulation_equals_one_full_micro_batch(tiny_model_dir):
    """Guards against per-micro-batch normalisation of the value loss."""
    batch = add_targets(random_batch(seed=14), seed=14)
    results = []
    for keys in (("critic.ppo_micro_batch_size_per_gpu=8",), ("critic.ppo_micro_batch_size_per_gpu=2",),
                 ("critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=40")):
        worker = CriticWorker(make_config(tiny_model_dir, *keys, "critic.ppo_epochs=2"), total_steps=1)
        results.append((worker.update_critic(batch), parameters(worker), gradients(worker)))
    assert_same_update(results[1], results[0])
    assert_same_update(results[2], results[0])  # token-budget micro-batches: the same update


def test_critic_checkpoint_then_fresh_worker_gives_identical_next_update(tiny_model_dir, tmp_path):
    """Guards against a resume that re-initialises the value head or loses optimiser state."""
    cfg = make_config(tiny_model_dir, "critic.lr_warmup_steps_ratio=0.5", "trainer.seed=3")
    first, second = add_targets(random_batch(seed=15), seed=15), add_targets(random_batch(seed=16), seed=16)
    original = CriticWorker(cfg, total_steps=4)
    original.update_critic(first)
    original.save_checkpoint(str(tmp_path / "critic"))
    resumed = CriticWorker(make_config(tiny_model_dir, "critic.lr_warmup_steps_ratio=0.5", "trainer.seed=4"),
                           total_steps=4)  # another seed: the value head must come from the checkpoint
    resumed.load_checkpoint(str(tmp_path / "critic"))
    assert original.update_critic(second) == resumed.update_critic(second)
    assert_equal_parameters(original, resumed)


@pytest.mark.parametrize("keys", [(), ("critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=40")],
                         ids=["rows", "token-budget"])
def test_on_policy_update_equals_a_value_pass_then_the_update(tiny_model_dir, keys):
    """Guards against the on-policy critic (config.computes_values_in_update: its update's forward gives the values,
    each micro-batch's GAE returns are computed from them) training on other targets than the two-pass step: the
    values it hands back equal compute_values', and its update equals update_critic's on the returns GAE makes from
    those values over the whole batch, in batch order whatever the micro-batches' grouping."""
    from verl.algorithms.core_algos import compute_gae_advantage_return
    from verl.algorithms.registry import AdvantageInputs

    cfg = make_config(tiny_model_dir, "critic.ppo_micro_batch_size_per_gpu=3", "algorithm.gamma=0.9",
                      "algorithm.lam=0.8", *keys)
    batch = random_batch(seed=17)
    gen = torch.Generator().manual_seed(17)
    rewards = torch.randn(batch["responses"].shape, generator=gen) * batch["loss_mask"]  # [B, R]
    batch.tensors["token_level_rewards"] = rewards
    two_pass, fused = CriticWorker(cfg, total_steps=1), CriticWorker(cfg, total_steps=1)
    values = two_pass.compute_values(batch)["values"]
    _, returns = compute_gae_advantage_return(AdvantageInputs(
        token_level_rewards=rewards, mask=batch["loss_mask"].float(), values=values,
        config={"gamma": 0.9, "lam": 0.8}))
    expected = two_pass.update_critic(Batch({**batch.tensors, "values": values, "returns": returns},
                                            dict(batch.non_tensors)))
    out = fused.update_on_policy(batch)
    torch.testing.assert_close(out["values"], values, atol=1e-6, rtol=0)
    assert out.meta["metrics"].keys() == expected.keys()
    for key, value in expected.items():
        assert out.meta["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert_equal_parameters(two_pass, fused)
    # only then (one epoch over one mini-batch of the step's rows, GAE's per-row returns) does the trainer use it
    assert computes_values_in_update(cfg)  # 8 rows a step, critic.ppo_mini_batch_size=8
    for other in ("critic.ppo_mini_batch_size=4", "critic.ppo_epochs=2"):
        assert not computes_values_in_update(make_config(tiny_model_dir, other))
    assert not computes_values_in_update(make_config(tiny_model_dir, "algorithm.adv_estimator=grpo",
                                                     "actor_rollout_ref.rollout.n=2"))  # no critic
