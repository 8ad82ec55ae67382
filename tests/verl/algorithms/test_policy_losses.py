"""GSPO's sequence-level policy loss (``verl/algorithms/policy_losses.py``) against plain loops and its closed form.

Guards against: a token-level ratio where the sequence's was meant (tokens of one sequence clipped apart), inserted
retrieval tokens counted in |y_i| or in the log-ratio sum, a gradient that is not the GSPO objective's, clipping that
ignores clip-higher or one of its ends, garbage on masked tokens leaking into the loss or the gradient, and a loss
mode that the config or the actor does not reach through the registry.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.verl.workers.worker_test_utils import add_targets, make_config, random_batch
from verl.algorithms import core_algos as ca
from verl.algorithms.policy_losses import compute_policy_loss_gspo as gspo
from verl.algorithms.registry import POLICY_LOSSES, PolicyLossInputs, register_policy_loss
from verl.config import ConfigError, load_config
from verl.workers.actor import ActorWorker

PAPER_LOW, PAPER_HIGH = 3e-4, 4e-4  # GSPO's clip range (Zheng et al. 2025)


def seeded_case(seed: int, rows: int = 6, cols: int = 9, scale: float = 0.05):
    """float64 old/new log-probs, per-token advantages and a mask whose rows have inserted holes (0) inside and a
    padding tail; row 0 is all padding."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, cols, dtype=torch.float64)
    for i in range(1, rows):
        length = int(torch.randint(1, cols + 1, (1,), generator=gen))
        mask[i, :length] = 1.0
        if length >= 4:
            start = int(torch.randint(1, length - 2, (1,), generator=gen))
            mask[i, start:start + 2] = 0.0  # an inserted block of two tokens
    old = -torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 3
    new = old + scale * torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    adv = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    return old, new, adv, mask


def loop_gspo(old, new, adv, mask, low: float, high: float, c: float | None, mode: str) -> tuple[float, float]:
    """The loss and the clip fraction by hand: per row, s = exp(mean of (new - old) over its counted tokens); per
    counted token, max(-A s, -A clip(s)) (bounded by -A c for A < 0 with dual clip); then the aggregation."""
    per_row, clipped, tokens = [], 0, 0
    for i in range(mask.shape[0]):
        counted = [t for t in range(mask.shape[1]) if mask[i, t] != 0]
        if not counted:
            continue
        s = math.exp(sum(float(new[i, t]) - float(old[i, t]) for t in counted) / len(counted))
        s_clip = min(max(s, 1.0 - low), 1.0 + high)
        losses = []
        for t in counted:
            a = float(adv[i, t])
            loss = max(-a * s, -a * s_clip)
            clipped += -a * s_clip > -a * s
            if c is not None and a < 0:
                loss = min(loss, -a * c)
            losses.append(loss)
        per_row.append(losses)
        tokens += len(counted)
    if mode == "token-mean":
        total = sum(sum(r) for r in per_row) / tokens
    elif mode == "seq-mean-token-sum":
        total = sum(sum(r) for r in per_row) / len(per_row)
    else:
        total = sum(sum(r) / len(r) for r in per_row) / len(per_row)
    return total, clipped / tokens


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", ca.AGG_MODES)
@pytest.mark.parametrize("clip_c", [None, 3.0])
def test_gspo_equals_its_formula_on_seeded_cases(seed, mode, clip_c):
    old, new, adv, mask = seeded_case(seed)
    loss, metrics = gspo(PolicyLossInputs(old, new, adv, mask, 0.01, 0.02, clip_c, mode))
    expected, clipfrac = loop_gspo(old, new, adv, mask, 0.01, 0.02, clip_c, mode)
    assert float(loss) == pytest.approx(expected, rel=1e-10)
    assert float(metrics["pg_clipfrac"]) == pytest.approx(clipfrac)
    counted = mask != 0
    assert float(metrics["ppo_kl"]) == pytest.approx(float((old - new)[counted].mean()))


def test_some_seeded_rows_are_clipped_and_some_are_not():
    """The seeded cases above exercise both branches of the clip (else they would test half the formula)."""
    fracs = [loop_gspo(*seeded_case(seed), 0.01, 0.02, None, "token-mean")[1] for seed in range(6)]
    assert 0.0 < sum(fracs) / len(fracs) < 1.0


def test_inserted_tokens_are_not_in_the_sequence_ratio_or_its_length():
    """A row of 3 policy tokens around an inserted one: s = exp((0.3 + 0.3 + 0.0) / 3), whatever the inserted token's
    log-probs say."""
    new = torch.tensor([[0.3, 0.3, 5.0, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 4, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)  # 0 = inserted by the environment
    adv = torch.ones(1, 4, dtype=torch.float64)
    loss, _ = gspo(PolicyLossInputs(old, new, adv, mask, 0.5, 0.5, None, "seq-mean-token-mean"))
    s = math.exp(0.6 / 3)
    assert loss.item() == pytest.approx(-s)
    (grad,) = torch.autograd.grad(loss, new)
    torch.testing.assert_close(grad, torch.tensor([[-s / 3, -s / 3, 0.0, -s / 3]], dtype=torch.float64))


def closed_form(old, new, adv_per_row, mask, low, high, mode):
    """GSPO's sequence objective written directly (no stop-gradient trick): s_i = exp(masked mean of new - old),
    term_i = max(-A_i s_i, -A_i clip(s_i)), weighted by 1/G, |y_i|/sum|y| or |y_i|/G for the three modes."""
    lengths = mask.sum(-1)  # [B]
    nonempty = lengths > 0
    s = torch.exp(((new - old) * mask).sum(-1) / lengths.clamp(min=1))  # [B]
    term = torch.maximum(-adv_per_row * s, -adv_per_row * torch.clamp(s, 1 - low, 1 + high))  # [B]
    weight = {"seq-mean-token-mean": torch.ones_like(lengths) / nonempty.sum(),
              "token-mean": lengths / lengths.sum(),
              "seq-mean-token-sum": lengths / nonempty.sum()}[mode]
    return (weight * term)[nonempty].sum()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ca.AGG_MODES)
def test_gspo_gradient_is_the_gradient_of_the_sequence_objective(seed, mode):
    """With one advantage per row (GRPO), autograd through the loss equals autograd through the closed form, for the
    paper's clip range; clipped rows get no gradient."""
    old, new, _, mask = seeded_case(seed, scale=6e-4)
    adv_per_row = torch.randn(mask.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    adv = adv_per_row[:, None].expand_as(mask).contiguous()  # [B, T]
    new = new.requires_grad_()
    loss, metrics = gspo(PolicyLossInputs(old, new, adv, mask, PAPER_LOW, PAPER_HIGH, None, mode))
    reference = closed_form(old, new, adv_per_row, mask, PAPER_LOW, PAPER_HIGH, mode)
    (g_loss,) = torch.autograd.grad(loss, new)
    (g_ref,) = torch.autograd.grad(reference, new)
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(g_loss, g_ref)
    assert (g_loss[mask == 0] == 0).all()
    if seed == 0:
        assert 0.0 < float(metrics["pg_clipfrac"]) < 1.0  # both clipped and unclipped rows in the case


@pytest.mark.parametrize("mode", ca.AGG_MODES)
def test_masked_tokens_change_neither_the_loss_nor_the_gradient(mode):
    """Garbage (huge, inf, NaN) log-probs and advantages on padding and inserted tokens: same loss, same gradient on
    the policy tokens, exactly zero and finite gradient on the masked ones."""
    old, new, adv, mask = seeded_case(3)
    masked = mask == 0
    garbage = torch.full_like(old, 1e4)
    garbage[0, 0], garbage[0, 1], garbage[-1, -1] = float("inf"), float("nan"), -float("inf")

    def run(old, new, adv):
        new = new.clone().requires_grad_()
        loss, metrics = gspo(PolicyLossInputs(old, new, adv, mask, 0.01, 0.02, 3.0, mode))
        (grad,) = torch.autograd.grad(loss, new)
        return loss, metrics, grad

    clean = run(old, new, adv)
    dirty = run(torch.where(masked, garbage, old), torch.where(masked, -garbage, new),
                torch.where(masked, garbage, adv))
    torch.testing.assert_close(dirty[0], clean[0])
    for key in clean[1]:
        torch.testing.assert_close(dirty[1][key], clean[1][key])
    torch.testing.assert_close(dirty[2], clean[2])
    assert torch.isfinite(dirty[2]).all() and (dirty[2][masked] == 0).all() and (dirty[2][~masked] != 0).any()


def one_row(adv: float, token_log_ratios: list[float], clip_c: float | None = None):
    """Loss, clip fraction and per-token gradient of one row (all tokens counted), paper clip range, GSPO's
    aggregation."""
    new = torch.tensor([token_log_ratios], dtype=torch.float64, requires_grad=True)
    old = torch.zeros_like(new)
    ones = torch.ones_like(old)
    loss, metrics = gspo(PolicyLossInputs(old, new, adv * ones, ones, PAPER_LOW, PAPER_HIGH, clip_c,
                                          "seq-mean-token-mean"))
    (grad,) = torch.autograd.grad(loss, new)
    return loss.item(), float(metrics["pg_clipfrac"]), grad[0].tolist()


@pytest.mark.parametrize(
    ("adv", "log_ratios", "loss", "clipfrac", "grad_per_token"),
    [
        # A > 0, s = e^1e-3 > 1 + high: clipped at 1 + 4e-4, no gradient
        (1.0, [1e-3, 1e-3], -(1 + PAPER_HIGH), 1.0, 0.0),
        # A > 0, s = e^3.5e-4: inside 1 + high (clip-higher) though outside a symmetric 1 + low
        (1.0, [3.5e-4, 3.5e-4], -math.exp(3.5e-4), 0.0, -math.exp(3.5e-4) / 2),
        # A > 0, s below 1 - low: the pessimistic (unclipped) term
        (1.0, [-1e-3, -1e-3], -math.exp(-1e-3), 0.0, -math.exp(-1e-3) / 2),
        # A < 0, s = e^-1e-3 < 1 - low: clipped at 1 - 3e-4, no gradient
        (-1.0, [-1e-3, -1e-3], 1 - PAPER_LOW, 1.0, 0.0),
        # A < 0, s = e^-2.5e-4: inside 1 - low, unclipped
        (-1.0, [-2.5e-4, -2.5e-4], math.exp(-2.5e-4), 0.0, math.exp(-2.5e-4) / 2),
        # A < 0, s above 1 + high: the pessimistic (unclipped) term
        (-1.0, [1e-3, 1e-3], math.exp(1e-3), 0.0, math.exp(1e-3) / 2),
        # token ratios e^0.5 and e^-0.5, far outside the range, but s = 1: nothing is clipped (PPO would clip both)
        (1.0, [0.5, -0.5], -1.0, 0.0, -0.5),
    ],
)
def test_gspo_clips_whole_sequences_at_both_ends(adv, log_ratios, loss, clipfrac, grad_per_token):
    got_loss, got_clipfrac, grad = one_row(adv, log_ratios)
    assert got_loss == pytest.approx(loss, rel=1e-12)
    assert got_clipfrac == clipfrac
    assert grad == pytest.approx([grad_per_token] * len(log_ratios), rel=1e-9, abs=1e-15)


def test_gspo_dual_clip_bounds_negative_advantages_and_rejects_c_below_one():
    loss, _, grad = one_row(-1.0, [2.0, 2.0], clip_c=3.0)  # s = e^2 > c = 3: the loss is bounded at -A c
    assert loss == pytest.approx(3.0) and grad == [0.0, 0.0]
    with pytest.raises(ValueError, match="clip_ratio_c"):
        gspo(PolicyLossInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.2,
                              0.9))


def test_gspo_is_a_config_value_through_the_registry():
    """The config accepts loss_mode=gspo (its choices come from the registry), lists it for a bad name, and checks
    the clip epsilons GSPO users set to small values."""
    assert ca.POLICY_LOSSES.get("gspo").fn is ca.compute_policy_loss_gspo
    cfg = load_config(["actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                       "actor_rollout_ref.actor.clip_ratio_low=3e-4", "actor_rollout_ref.actor.clip_ratio_high=4e-4",
                       "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
    with pytest.raises(ConfigError, match=r"policy_loss\.loss_mode='gpso' is invalid: allowed one of vanilla, gspo"):
        load_config(["actor_rollout_ref.actor.policy_loss.loss_mode=gpso"])
    with pytest.raises(ConfigError, match=r"actor\.clip_ratio_low=3000\.0 is invalid: allowed null \(= clip_ratio\) "
                                          r"or a number in \(0, 1\)"):
        load_config(["actor_rollout_ref.actor.clip_ratio_low=3e3"])
    with pytest.raises(ConfigError, match=r"actor\.clip_ratio_high=-0\.0004 is invalid: allowed null \(= clip_ratio\) "
                                          r"or the upper clip range \(DAPO's clip-higher\), a number in \(0, 10\]"):
        load_config(["actor_rollout_ref.actor.clip_ratio_high=-4e-4"])


def test_the_actor_hands_gspo_the_clip_higher_range(tiny_model_dir):
    """The actor's update calls the registered GSPO loss with clip_ratio_low/high as configured (clip-higher applies
    to GSPO too) and the configured aggregation, and logs its metrics."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                      "actor_rollout_ref.actor.clip_ratio_low=3e-4", "actor_rollout_ref.actor.clip_ratio_high=4e-4",
                      "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    worker = ActorWorker(cfg, total_steps=1)
    assert worker.policy_loss is gspo
    calls = []

    def recording(inputs: PolicyLossInputs):
        calls.append((inputs.clip_ratio_low, inputs.clip_ratio_high, inputs.clip_ratio_c, inputs.loss_agg_mode))
        return gspo(inputs)

    worker.policy_loss = recording
    metrics = worker.update_actor(add_targets(random_batch(seed=5), seed=5))
    assert calls and all(call == (PAPER_LOW, PAPER_HIGH, 3.0, "seq-mean-token-mean") for call in calls)
    assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0 and math.isfinite(metrics["actor/pg_loss"])


RECORDS: list[PolicyLossInputs] = []  # what the actor handed the loss registered below


@register_policy_loss("recorded_vanilla_for_test", config_args=("entropy_coeff", "policy_loss.loss_mode"))
def recorded_vanilla(inputs: PolicyLossInputs):
    """PPO's loss, recording its input; registered here, outside verl, with two actor keys declared."""
    RECORDS.append(inputs)
    return ca.compute_policy_loss(inputs)


@register_policy_loss("reads_no_such_key_for_test", config_args=("clip_ratio", "policy_loss.no_such_key"))
def reads_a_missing_key(inputs: PolicyLossInputs):
    return ca.compute_policy_loss(inputs)


def test_a_policy_loss_registered_outside_verl_gets_the_record_and_trains_the_actor(tiny_model_dir):
    """Guards against a loss registered outside the package that the config or the actor does not reach, gets
    positional arguments instead of the record, or sees actor keys it did not declare: the config accepts its name,
    the actor calls it with one PolicyLossInputs per micro-batch ([B, T] tensors, the configured settings, exactly
    the declared keys, read-only), and the loss it returns is vanilla's on that record, bit for bit."""
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.actor.policy_loss.loss_mode=recorded_vanilla_for_test",
                      "actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.entropy_coeff=0.01")
    assert POLICY_LOSSES.get("recorded_vanilla_for_test").config_args == ("entropy_coeff", "policy_loss.loss_mode")
    worker = ActorWorker(cfg, total_steps=1)
    RECORDS.clear()
    metrics = worker.update_actor(add_targets(random_batch(seed=7), seed=7))
    assert RECORDS and all(type(inputs) is PolicyLossInputs for inputs in RECORDS)
    inputs = RECORDS[0]
    shape = inputs.mask.shape
    assert len(shape) == 2 and all(t.shape == shape for t in (inputs.old_log_prob, inputs.log_prob,
                                                              inputs.advantages))
    assert inputs.log_prob.requires_grad and not inputs.old_log_prob.requires_grad and inputs.token_weights is None
    assert (inputs.clip_ratio_low, inputs.clip_ratio_high, inputs.clip_ratio_c, inputs.loss_agg_mode) == \
        (0.2, 0.28, 3.0, "token-mean")
    assert inputs.global_tokens is not None and inputs.global_seqs is not None
    assert dict(inputs.config) == {"entropy_coeff": 0.01, "policy_loss.loss_mode": "recorded_vanilla_for_test"}
    with pytest.raises(KeyError):
        inputs.config["clip_ratio"]  # not declared
    with pytest.raises(TypeError):
        inputs.config["entropy_coeff"] = 0.0  # read-only
    loss, _ = recorded_vanilla(inputs)
    reference, _ = ca.compute_policy_loss(PolicyLossInputs(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.mask, 0.2, 0.28, 3.0, "token-mean",
        inputs.global_tokens, inputs.global_seqs))
    assert torch.equal(loss, reference)
    assert math.isfinite(metrics["actor/pg_loss"]) and 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0


def test_a_policy_loss_declaring_a_key_the_actor_lacks_is_refused_when_the_config_is_checked(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"loss_mode='reads_no_such_key_for_test' is invalid: .*"
                                          r"\['policy_loss\.no_such_key'\]"):
        make_config(tiny_model_dir, "actor_rollout_ref.actor.policy_loss.loss_mode=reads_no_such_key_for_test")
