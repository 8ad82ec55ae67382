"""Tests of the pure RL algorithms: each vectorised function against a plain loop written here.

Masks are drawn like real Search-R1 rows: a response of random length (right padding), holes in
the middle where retrieved ``<information>`` blocks were inserted, and some all-zero rows.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from verl.algorithms import core_algos as ca
from verl.algorithms.core_algos import AdvantageInputs
from verl.algorithms.logprobs import entropy_from_logits

SEEDS = range(8)


def gae(rewards, values, mask, gamma, lam):
    return ca.compute_gae_advantage_return(AdvantageInputs(rewards, mask, values=values,
                                                           config={"gamma": gamma, "lam": lam}))


def grpo(rewards, mask, index, norm_by_std=True):
    return ca.compute_grpo_outcome_advantage(AdvantageInputs(rewards, mask, index=index,
                                                             config={"norm_adv_by_std_in_grpo": norm_by_std}))


def random_mask(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """[B, T] float mask: per row a response of random length with random inserted blocks (0) inside;
    row 0 is always all-zero (a padding row)."""
    mask = torch.zeros(rows, cols)
    for i in range(1, rows):
        length = int(torch.randint(0, cols + 1, (1,), generator=gen))
        mask[i, :length] = 1.0
        for _ in range(int(torch.randint(0, 3, (1,), generator=gen))):
            if length < 3:
                break
            start = int(torch.randint(1, length - 1, (1,), generator=gen))
            width = int(torch.randint(1, length - start, (1,), generator=gen))
            mask[i, start:start + width] = 0.0
    return mask


def random_case(seed: int) -> tuple[torch.Generator, int, int, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(2, 7, (1,), generator=gen))
    cols = int(torch.randint(1, 13, (1,), generator=gen))
    return gen, rows, cols, random_mask(gen, rows, cols)


def loop_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whitening over the masked entries with plain Python statistics."""
    picked = [float(x[i, t]) for i in range(x.shape[0]) for t in range(x.shape[1]) if mask[i, t]]
    mean = sum(picked) / len(picked) if picked else 0.0
    var = sum((v - mean) ** 2 for v in picked) / max(len(picked) - 1, 1)
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        for t in range(x.shape[1]):
            if mask[i, t]:
                out[i, t] = (float(x[i, t]) - mean) / math.sqrt(var + eps)
    return out


def loop_compressed_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                        lam: float) -> torch.Tensor:
    """Unwhitened GAE computed on each row compressed to its policy tokens; a reward on an inserted
    token belongs to the policy token before it; scattered back to [B, T]."""
    out = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        positions = [t for t in range(rewards.shape[1]) if mask[i, t]]
        step_rewards = []
        for k, p in enumerate(positions):
            end = positions[k + 1] if k + 1 < len(positions) else rewards.shape[1]
            step_rewards.append(sum(float(rewards[i, t]) for t in range(p, end)))
        adv_next, value_next = 0.0, 0.0
        for k in reversed(range(len(positions))):
            value = float(values[i, positions[k]])
            delta = step_rewards[k] + gamma * value_next - value
            adv_next = delta + gamma * lam * adv_next
            value_next = value
            out[i, positions[k]] = adv_next
    return out


# ----------------------------------------------------------------------------------------------
# Masked statistics
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_masked_stats_match_loop(seed: int) -> None:
    """Guards against statistics that include masked (padding / retrieved) entries or divide by T."""
    gen, rows, cols, mask = random_case(seed)
    x = torch.randn(rows, cols, generator=gen)
    x[mask == 0] = 1e6  # garbage where masked must not leak in
    picked = [float(x[i, t]) for i in range(rows) for t in range(cols) if mask[i, t]]
    assert float(ca.masked_sum(x, mask)) == pytest.approx(sum(picked), rel=1e-5, abs=1e-5)
    mean = sum(picked) / max(len(picked), 1)
    assert float(ca.masked_mean(x, mask)) == pytest.approx(mean, rel=1e-5, abs=1e-5)
    var = sum((v - mean) ** 2 for v in picked) / max(len(picked) - 1, 1)
    assert float(ca.masked_var(x, mask)) == pytest.approx(var, rel=1e-4, abs=1e-5)
    row_means = ca.masked_mean(x, mask, dim=-1)
    for i in range(rows):
        vals = [float(x[i, t]) for t in range(cols) if mask[i, t]]
        assert float(row_means[i]) == pytest.approx(sum(vals) / max(len(vals), 1), rel=1e-5, abs=1e-5)
    torch.testing.assert_close(ca.masked_whiten(x, mask), loop_whiten(x, mask), rtol=1e-4, atol=1e-4)


def test_masked_stats_empty_mask_no_nan() -> None:
    """Guards against NaN from 0/0 when a micro-batch has no counted token (all-zero mask)."""
    x = torch.randn(3, 4)
    empty = torch.zeros(3, 4)
    for value in (ca.masked_mean(x, empty), ca.masked_var(x, empty), ca.masked_whiten(x, empty).sum()):
        assert float(value) == 0.0
    one = torch.zeros(3, 4)
    one[1, 2] = 1
    assert float(ca.masked_var(x, one)) == 0.0
    assert torch.isfinite(ca.masked_whiten(x, one)).all()


def test_masked_stats_ignore_nan_and_inf_under_the_mask() -> None:
    """Guards against ``x * mask`` statistics, where a NaN/inf in a padding slot (0 * inf = NaN)
    poisons the whole batch."""
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), float("-inf")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(ca.masked_sum(x, mask)) == 6.0
    assert float(ca.masked_mean(x, mask)) == 2.0
    assert float(ca.masked_var(x, mask)) == 1.0
    assert torch.isfinite(ca.masked_whiten(x, mask)).all()


def test_masked_whiten_keeps_mean_when_not_shifting() -> None:
    """Guards against shift_mean=False still centring the values (it must only rescale)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=gen) + 3.0
    mask = torch.ones(4, 6)
    mask[:, 4:] = 0
    out = ca.masked_whiten(x, mask, shift_mean=False)
    assert float(ca.masked_mean(out, mask)) == pytest.approx(float(ca.masked_mean(x, mask)), rel=1e-5)
    assert float(ca.masked_var(out, mask)) == pytest.approx(1.0, rel=1e-4)
    assert (out[mask == 0] == 0).all()


# ----------------------------------------------------------------------------------------------
# Advantage estimators
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_matches_loop(seed: int) -> None:
    """Guards against GAE bootstrapping through retrieved/padding tokens, dropping rewards that sit
    on an inserted token, whitening over masked entries, or returns built from whitened advantages."""
    gen, rows, cols, mask = random_case(seed)
    rewards = torch.randn(rows, cols, generator=gen)
    values = torch.randn(rows, cols, generator=gen)
    gamma, lam = float(torch.rand(1, generator=gen)) * 0.5 + 0.5, float(torch.rand(1, generator=gen))
    adv, returns = gae(rewards, values, mask, gamma, lam)
    raw = loop_compressed_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(returns, (raw + values) * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv, loop_whiten(raw, mask), rtol=1e-4, atol=1e-4)
    assert (adv[mask == 0] == 0).all() and (returns[mask == 0] == 0).all()


def test_gae_retrieved_block_is_transparent() -> None:
    """Guards against the critic seeing inserted tokens: adding a masked block (any values, rewards)
    between two turns must leave the policy tokens' advantages and returns unchanged."""
    gen = torch.Generator().manual_seed(1)
    rewards = torch.zeros(1, 6)
    rewards[0, 5] = 1.0
    values = torch.randn(1, 6, generator=gen)
    mask = torch.ones(1, 6)
    inserted = torch.randn(1, 4, generator=gen) * 100
    big_rewards = torch.cat([rewards[:, :3], torch.zeros(1, 4), rewards[:, 3:]], dim=1)
    big_values = torch.cat([values[:, :3], inserted, values[:, 3:]], dim=1)
    big_mask = torch.cat([mask[:, :3], torch.zeros(1, 4), mask[:, 3:]], dim=1)
    keep = big_mask[0] == 1
    _, ret = gae(rewards, values, mask, 0.9, 0.8)
    _, big_ret = gae(big_rewards, big_values, big_mask, 0.9, 0.8)
    torch.testing.assert_close(big_ret[0, keep], ret[0])


def test_gae_hand_computed() -> None:
    """Guards against an off-by-one in the recursion: 3 tokens, gamma=lam=1, reward 1 at the end."""
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 0.9]])
    _, returns = gae(rewards, values, torch.ones(1, 3), 1.0, 1.0)
    torch.testing.assert_close(returns, torch.ones(1, 3))  # lam = 1: Monte Carlo return everywhere


def loop_group_scores(rewards: torch.Tensor, index: np.ndarray) -> tuple[list[float], dict[str, list[float]]]:
    scores = [float(rewards[i].sum()) for i in range(rewards.shape[0])]
    groups: dict[str, list[float]] = {}
    for uid, s in zip(index, scores, strict=True):
        groups.setdefault(uid, []).append(s)
    return scores, groups


def random_outcome_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    gen, rows, cols, mask = random_case(seed)
    rows = rows + 6
    mask = torch.cat([mask, random_mask(gen, 6, cols)], dim=0)
    rewards = torch.zeros(rows, cols)
    rewards[:, -1] = torch.randint(0, 2, (rows,), generator=gen).float() + torch.rand(rows, generator=gen)
    perm = torch.randperm(rows, generator=gen).tolist()
    index = np.array([f"uid-{perm[i] % 4}" for i in range(rows)], dtype=object)  # interleaved groups
    index[0] = "uid-single"
    return rewards, mask, index


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_loop(seed: int, norm_by_std: bool) -> None:
    """Guards against GRPO/Dr. GRPO normalising over the wrong group, a biased std, or a NaN for a
    group of one sample."""
    rewards, mask, index = random_outcome_case(seed)
    adv, returns = grpo(rewards, mask, index, norm_by_std)
    scores, groups = loop_group_scores(rewards, index)
    expected = torch.zeros_like(rewards)
    for i, uid in enumerate(index):
        group = groups[uid]
        mean, std = (statistics.mean(group), statistics.stdev(group)) if len(group) > 1 else (0.0, 1.0)
        value = (scores[i] - mean) / (std + 1e-6) if norm_by_std else scores[i] - mean
        expected[i] = value * mask[i]
    torch.testing.assert_close(adv, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(adv, returns)


def test_grpo_groups_by_uid_not_position() -> None:
    """Guards against grouping rows by position (e.g. consecutive blocks of n): shuffling the rows
    must shuffle the advantages with them and change nothing else."""
    rewards, mask, index = random_outcome_case(3)
    adv, _ = grpo(rewards, mask, index)
    perm = torch.randperm(rewards.shape[0], generator=torch.Generator().manual_seed(5))
    shuffled, _ = grpo(rewards[perm], mask[perm], index[perm.numpy()])
    torch.testing.assert_close(shuffled, adv[perm])


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_matches_loop(seed: int) -> None:
    """Guards against RLOO including the sample itself in its baseline or grouping by position."""
    rewards, mask, index = random_outcome_case(seed)
    adv, returns = ca.compute_rloo_outcome_advantage(AdvantageInputs(rewards, mask, index=index))
    scores, groups = loop_group_scores(rewards, index)
    expected = torch.zeros_like(rewards)
    for i, uid in enumerate(index):
        others = list(groups[uid])
        others.remove(scores[i])
        baseline = sum(others) / len(others) if others else 0.0
        expected[i] = (scores[i] - baseline) * mask[i]
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(adv, returns)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_matches_loop(seed: int) -> None:
    """Guards against REINFORCE++ returns that reset or discount across inserted tokens, or
    whitening that counts masked entries."""
    gen, rows, cols, mask = random_case(seed)
    rewards = torch.randn(rows, cols, generator=gen) * 0.1
    gamma = 0.9
    adv, returns = ca.compute_reinforce_plus_plus_outcome_advantage(AdvantageInputs(rewards, mask,
                                                                                    config={"gamma": gamma}))
    expected = torch.zeros_like(rewards)
    for i in range(rows):
        positions = [t for t in range(cols) if mask[i, t]]
        running = 0.0
        for k in reversed(range(len(positions))):
            end = positions[k + 1] if k + 1 < len(positions) else cols
            running = sum(float(rewards[i, t]) for t in range(positions[k], end)) + gamma * running
            expected[i, positions[k]] = running
    torch.testing.assert_close(returns, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv, loop_whiten(expected, mask), rtol=1e-4, atol=1e-4)


def test_adv_estimator_registry() -> None:
    """Guards against a config name that silently maps to nothing, an error that hides the choices, and a
    built-in whose declared needs disagree with what it reads (the trainer fills only what is declared)."""
    assert {"gae", "grpo", "reinforce_plus_plus", "rloo"} <= set(ca.ADV_ESTIMATORS.names())
    grpo_entry = ca.ADV_ESTIMATORS.get("grpo")
    assert grpo_entry.fn is ca.compute_grpo_outcome_advantage
    builtins = ("gae", "grpo", "reinforce_plus_plus", "rloo")
    needs = {name: (e.needs_critic, e.needs_groups, e.config_args)
             for name, e in zip(builtins, map(ca.ADV_ESTIMATORS.get, builtins), strict=True)}
    assert needs == {"gae": (True, False, ("gamma", "lam")), "grpo": (False, True, ("norm_adv_by_std_in_grpo",)),
                     "reinforce_plus_plus": (False, False, ("gamma",)), "rloo": (False, True, ())}
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo': valid are gae, grpo, rloo"):
        ca.ADV_ESTIMATORS.get("ppo")
    with pytest.raises(ValueError, match="already registered"):
        ca.register_adv_estimator("gae")(ca.compute_gae_advantage_return)
    rewards, mask, index = random_outcome_case(0)
    with pytest.raises(KeyError):  # an argument it did not declare is not handed over
        ca.compute_grpo_outcome_advantage(AdvantageInputs(rewards, mask, index=index))


# ----------------------------------------------------------------------------------------------
# Loss aggregation and micro-batching
# ----------------------------------------------------------------------------------------------


def loop_agg(loss: torch.Tensor, mask: torch.Tensor, mode: str) -> float:
    rows = [[float(loss[i, t]) for t in range(loss.shape[1]) if mask[i, t]] for i in range(loss.shape[0])]
    rows = [r for r in rows if r]
    if mode == "token-mean":
        tokens = [v for r in rows for v in r]
        return sum(tokens) / max(len(tokens), 1)
    per_seq = [sum(r) if mode == "seq-mean-token-sum" else sum(r) / len(r) for r in rows]
    return sum(per_seq) / max(len(per_seq), 1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ca.AGG_MODES)
def test_agg_loss_matches_loop(seed: int, mode: str) -> None:
    """Guards against aggregation that counts padding/inserted tokens or empty rows."""
    gen, _, _, mask = random_case(seed)
    loss = torch.randn(mask.shape, generator=gen)
    assert float(ca.agg_loss(loss, mask, mode)) == pytest.approx(loop_agg(loss, mask, mode), rel=1e-5, abs=1e-6)


def test_agg_loss_unknown_mode() -> None:
    """Guards against a typo in loss_agg_mode falling back to some default silently."""
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        ca.agg_loss(torch.zeros(2, 2), torch.ones(2, 2), "mean")


@pytest.mark.parametrize("mode", ca.AGG_MODES)
def test_micro_batches_sum_to_full_batch(mode: str) -> None:
    """Guards against gradient accumulation that averages micro-batch means (wrong weights when
    micro-batches hold different token/sequence counts): with global counts the summed micro-batch
    losses and gradients equal the full-batch ones, for the policy and the value loss."""
    gen = torch.Generator().manual_seed(7)
    mask = random_mask(gen, 10, 9)
    old = -torch.rand(10, 9, generator=gen) * 3
    logp = (old + 0.3 * torch.randn(10, 9, generator=gen)).requires_grad_()
    adv = torch.randn(10, 9, generator=gen)
    vpred = torch.randn(10, 9, generator=gen).requires_grad_()
    values_old, returns = torch.randn(10, 9, generator=gen), torch.randn(10, 9, generator=gen)

    def losses(sl: slice, **glob: float) -> torch.Tensor:
        pg, _ = ca.compute_policy_loss(ca.PolicyLossInputs(old[sl], logp[sl], adv[sl], mask[sl], 0.2, 0.28, 3.0,
                                                           mode, **glob))
        vf, _ = ca.compute_value_loss(vpred[sl], values_old[sl], returns[sl], mask[sl], 0.5, mode, **glob)
        return pg + vf

    full = losses(slice(None))
    full_grads = torch.autograd.grad(full, (logp, vpred))
    glob = {"global_tokens": float(mask.sum()), "global_seqs": float((mask.sum(-1) > 0).sum())}
    summed = sum(losses(slice(s, s + n), **glob) for s, n in ((0, 3), (3, 1), (4, 6)))
    summed_grads = torch.autograd.grad(summed, (logp, vpred))
    torch.testing.assert_close(summed, full)
    for a, b in zip(summed_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------------------------
# Policy and value losses
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ca.AGG_MODES)
def test_policy_loss_is_policy_gradient_at_ratio_one(mode: str) -> None:
    """Guards against a sign error or a wrong surrogate: on-policy (ratio 1) the PPO loss has the
    gradient of the plain policy-gradient loss -(A * log pi), and its value is that of the
    surrogate -(A * ratio) = -A (the log pi values themselves never enter the PPO loss)."""
    gen = torch.Generator().manual_seed(2)
    mask = random_mask(gen, 5, 7)
    logp = (-torch.rand(5, 7, generator=gen) * 4).requires_grad_()
    adv = torch.randn(5, 7, generator=gen)
    loss, metrics = ca.compute_policy_loss(ca.PolicyLossInputs(logp.detach(), logp, adv, mask, 0.2, 0.2, 3.0, mode))
    reference = ca.agg_loss(-(adv * logp), mask, mode)
    (g_ppo,) = torch.autograd.grad(loss, logp, retain_graph=True)
    (g_ref,) = torch.autograd.grad(reference, logp)
    torch.testing.assert_close(loss, ca.agg_loss(-adv, mask, mode))
    torch.testing.assert_close(g_ppo, g_ref)
    assert float(metrics["pg_clipfrac"]) == 0.0 and float(metrics["ppo_kl"]) == 0.0


def one_token_policy_loss(adv: float, ratio: float, clip_c: float | None) -> tuple[float, dict, float]:
    """Loss, metrics and d loss / d log pi for a single token with the given advantage and ratio."""
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, metrics = ca.compute_policy_loss(ca.PolicyLossInputs(torch.zeros(1, 1), logp, torch.tensor([[adv]]),
                                                               torch.ones(1, 1), clip_ratio_low=0.2,
                                                               clip_ratio_high=0.28, clip_ratio_c=clip_c))
    (grad,) = torch.autograd.grad(loss, logp)
    return float(loss.detach()), {k: float(v) for k, v in metrics.items()}, float(grad)


@pytest.mark.parametrize(
    ("adv", "ratio", "clip_c", "loss", "clipfrac", "lower", "grad"),
    [
        (1.0, 1.5, None, -1.28, 1.0, 0.0, 0.0),  # A > 0, ratio above 1 + high: clipped (clip-higher 0.28)
        (1.0, 1.2, None, -1.2, 0.0, 0.0, -1.2),  # inside [0.8, 1.28]: unclipped (symmetric 0.2 would clip)
        (1.0, 0.5, None, -0.5, 0.0, 0.0, -0.5),  # A > 0, ratio below 1 - low: the pessimistic term is unclipped
        (-1.0, 0.5, None, 0.8, 1.0, 0.0, 0.0),  # A < 0, ratio below 1 - low: clipped at 0.8
        (-1.0, 2.0, 3.0, 2.0, 0.0, 0.0, 2.0),  # A < 0, 1.28 < ratio < c: unclipped, dual clip inactive
        (-1.0, 5.0, 3.0, 3.0, 0.0, 1.0, 0.0),  # A < 0, ratio > c: dual clip bounds the loss at -A * c
        (-1.0, 5.0, None, 5.0, 0.0, 0.0, 5.0),  # same token without dual clip: unbounded
        (2.0, 5.0, 3.0, -2.56, 1.0, 0.0, 0.0),  # A > 0: dual clip never applies
    ],
)
def test_policy_loss_clipping_hand_computed(adv, ratio, clip_c, loss, clipfrac, lower, grad) -> None:
    """Guards against symmetric clipping where clip-higher was asked, dual clip applied to positive
    advantages, or clipped tokens that still pass gradient."""
    got_loss, metrics, got_grad = one_token_policy_loss(adv, ratio, clip_c)
    assert got_loss == pytest.approx(loss, rel=1e-5)
    assert metrics["pg_clipfrac"] == clipfrac and metrics["pg_clipfrac_lower"] == lower
    assert got_grad == pytest.approx(grad, rel=1e-5, abs=1e-7)
    assert metrics["ppo_kl"] == pytest.approx(-math.log(ratio), rel=1e-5)


def test_policy_loss_rejects_dual_clip_below_one() -> None:
    """Guards against a dual-clip constant <= 1 that would cap every negative-advantage token."""
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ca.compute_policy_loss(ca.PolicyLossInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                                                   torch.ones(1, 1), 0.2, 0.2, 0.9))


def masked_case(seed: int = 11) -> tuple[torch.Generator, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return gen, random_mask(gen, 6, 10)


@pytest.mark.parametrize("mode", ca.AGG_MODES)
def test_masked_tokens_get_exactly_zero_gradient(mode: str) -> None:
    """Guards against inserted (retrieved) or padding tokens receiving gradient from the policy loss,
    the value loss, the KL loss or the entropy bonus, even with garbage values there."""
    gen, mask = masked_case()
    masked = mask == 0
    garbage = torch.randn(mask.shape, generator=gen) * 1e3
    old = torch.where(masked, garbage, -torch.rand(mask.shape, generator=gen))
    logp = torch.where(masked, -garbage, old + 0.1 * torch.randn(mask.shape, generator=gen)).requires_grad_()
    ref = torch.where(masked, garbage, old)
    adv = torch.randn(mask.shape, generator=gen)
    vpred = torch.where(masked, garbage, torch.randn(mask.shape, generator=gen)).requires_grad_()
    logits = (torch.randn(*mask.shape, 5, generator=gen) * 3).requires_grad_()

    pg, _ = ca.compute_policy_loss(ca.PolicyLossInputs(old, logp, adv, mask, 0.2, 0.28, 3.0, mode))
    vf, _ = ca.compute_value_loss(vpred, torch.zeros_like(adv), adv, mask, 0.5, mode)
    kl = sum(ca.agg_loss(ca.kl_penalty(logp, ref, kind), mask, mode) for kind in ca.KL_ESTIMATORS.names())
    ent = ca.agg_loss(entropy_from_logits(logits), mask, mode)
    g_logp, g_vpred, g_logits = torch.autograd.grad(pg + vf + kl + ent, (logp, vpred, logits))
    for grad in (g_logp, g_vpred):
        assert torch.isfinite(grad).all()
        assert (grad[masked] == 0).all()
        assert (grad[~masked] != 0).any()
    assert (g_logits[masked] == 0).all() and torch.isfinite(g_logits).all()


def test_value_loss_hand_computed() -> None:
    """Guards against value clipping around the wrong centre, a missing 0.5, or min instead of max."""
    vpred = torch.tensor([[2.0, 0.2, 5.0, 1.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0, 9.0]])
    returns = torch.tensor([[1.0, 1.0, 5.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, clipfrac = ca.compute_value_loss(vpred, old, returns, mask, cliprange_value=0.5)
    # token 0: unclipped (2-1)^2 = 1, clipped (0.5-1)^2 = 0.25 -> 1
    # token 1: unclipped 0.64, clipped (0.2-1)^2 = 0.64 -> 0.64 (not "clipped": equal)
    # token 2: unclipped 0, clipped (0.5-5)^2 = 20.25 -> 20.25 (clipped term active)
    expected = 0.5 * (1.0 + 0.64 + 20.25) / 3
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert float(clipfrac) == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(loss, vpred)
    torch.testing.assert_close(grad, torch.tensor([[1.0 / 3, -0.8 / 3, 0.0, 0.0]]))


# ----------------------------------------------------------------------------------------------
# KL estimators and controllers
# ----------------------------------------------------------------------------------------------


def test_kl_estimators_match_formulas() -> None:
    """Guards against swapped arguments (KL(ref || pi)) or a wrong k2/k3 formula; k3 must be >= 0."""
    gen = torch.Generator().manual_seed(4)
    logp = -torch.rand(4, 6, generator=gen) * 5
    ref = -torch.rand(4, 6, generator=gen) * 5
    results = {kind: ca.kl_penalty(logp, ref, kind) for kind in ca.KL_ESTIMATORS.names()}
    assert set(results) == {"kl", "abs", "mse", "low_var_kl"}
    for i in range(4):
        for t in range(6):
            a, b = float(logp[i, t]), float(ref[i, t])
            assert float(results["kl"][i, t]) == pytest.approx(a - b, rel=1e-5, abs=1e-6)
            assert float(results["abs"][i, t]) == pytest.approx(abs(a - b), rel=1e-5, abs=1e-6)
            assert float(results["mse"][i, t]) == pytest.approx(0.5 * (a - b) ** 2, rel=1e-5, abs=1e-6)
            k3 = min(max(math.exp(b - a) - (b - a) - 1, -10.0), 10.0)
            assert float(results["low_var_kl"][i, t]) == pytest.approx(k3, rel=1e-5, abs=1e-6)
    assert (results["low_var_kl"] >= 0).all()
    assert float(results["low_var_kl"].max()) <= 10.0
    with pytest.raises(ValueError, match="unknown KL estimator 'k3': valid are kl, abs, mse, low_var_kl"):
        ca.kl_penalty(logp, ref, "k3")


def test_k1_and_k3_are_unbiased_estimates_of_kl() -> None:
    """Guards against estimating KL(ref || pi) instead of KL(pi || ref): on samples from pi, the
    means of k1 and k3 approach the exact KL(pi || ref) of two categorical distributions."""
    gen = torch.Generator().manual_seed(0)
    pi = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    ref = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2])
    exact = float((pi * (pi / ref).log()).sum())
    samples = torch.multinomial(pi, 200_000, replacement=True, generator=gen)
    logp, ref_logp = pi.log()[samples][None], ref.log()[samples][None]
    assert float(ca.kl_penalty(logp, ref_logp, "kl").mean()) == pytest.approx(exact, abs=0.01)
    assert float(ca.kl_penalty(logp, ref_logp, "low_var_kl").mean()) == pytest.approx(exact, abs=0.01)


def test_adaptive_kl_controller_moves_beta_the_right_way() -> None:
    """Guards against a controller that lowers beta when the KL is too high (or vice versa), or an
    unclipped error that lets one step change beta arbitrarily."""
    ctrl = ca.get_kl_controller("adaptive", kl_coef=0.1, target_kl=1.0, horizon=100)
    ctrl.update(current_kl=1.1, n_steps=10)
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.1 * 10 / 100))
    before = ctrl.value
    ctrl.update(current_kl=50.0, n_steps=10)  # error clipped to +0.2
    assert ctrl.value == pytest.approx(before * (1 + 0.2 * 10 / 100))
    before = ctrl.value
    ctrl.update(current_kl=0.0, n_steps=10)  # error clipped to -0.2
    assert ctrl.value == pytest.approx(before * (1 - 0.2 * 10 / 100))
    fixed = ca.get_kl_controller("fixed", kl_coef=0.1, target_kl=1.0, horizon=100)
    fixed.update(current_kl=50.0, n_steps=10)
    assert fixed.value == 0.1
    with pytest.raises(ValueError, match="adaptive"):
        ca.get_kl_controller("pid", 0.1, 1.0, 100)


def test_apply_kl_penalty_matches_loop() -> None:
    """Guards against a KL penalty on inserted/padding tokens, beta read after the update, or the
    controller fed a token count-dependent KL instead of the mean per-sequence KL."""
    gen, mask = masked_case(3)
    scores = torch.zeros(mask.shape)
    scores[:, -1] = 1.0
    logp = -torch.rand(mask.shape, generator=gen) * 3
    ref = -torch.rand(mask.shape, generator=gen) * 3
    ctrl = ca.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.5, horizon=1000)
    rewards, metrics = ca.apply_kl_penalty(scores, logp, ref, mask, ctrl, "kl")
    seq_kls = []
    for i in range(mask.shape[0]):
        row = [float(logp[i, t] - ref[i, t]) for t in range(mask.shape[1]) if mask[i, t]]
        if row:
            seq_kls.append(sum(row))
        for t in range(mask.shape[1]):
            kl = float(logp[i, t] - ref[i, t]) if mask[i, t] else 0.0
            assert float(rewards[i, t]) == pytest.approx(float(scores[i, t]) - 0.2 * kl, rel=1e-5, abs=1e-6)
    current = sum(seq_kls) / len(seq_kls)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current, rel=1e-5)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.2)
    error = min(max(current / 0.5 - 1, -0.2), 0.2)
    assert ctrl.value == pytest.approx(0.2 * (1 + error * mask.shape[0] / 1000))


@pytest.mark.parametrize("seed", SEEDS)
def test_tis_weighted_policy_loss_gradient_matches_a_plain_loop(seed):
    """Guards against TIS weights that carry gradient, are capped on the wrong side, or multiply the
    wrong term: d loss / d log_prob per token against the PPO derivative written out by hand."""
    gen, rows, cols, mask = random_case(seed)
    old = -2.0 + 0.5 * torch.randn(rows, cols, generator=gen)
    rollout = (old + 0.6 * torch.randn(rows, cols, generator=gen)).requires_grad_()
    log_prob = (old + 0.3 * torch.randn(rows, cols, generator=gen)).requires_grad_()
    adv = torch.randn(rows, cols, generator=gen)
    cap, eps = 1.5, 0.2
    weights = ca.truncated_is_weights(old, rollout, cap)
    assert not weights.requires_grad
    loss, _ = ca.compute_policy_loss(ca.PolicyLossInputs(old, log_prob, adv, mask, eps, eps, None, "token-mean",
                                                         token_weights=weights))
    loss.backward()
    count = max(float(mask.sum()), 1.0)
    for i in range(rows):
        for t in range(cols):
            w = min(math.exp(float(old[i, t] - rollout.detach()[i, t])), cap)
            assert float(weights[i, t]) == pytest.approx(w, rel=1e-5)
            r, a = math.exp(float(log_prob[i, t] - old[i, t])), float(adv[i, t])
            clipped_active = -a * min(max(r, 1 - eps), 1 + eps) > -a * r  # the constant clipped term wins
            expected = 0.0 if mask[i, t] == 0 or clipped_active else -a * r * w / count
            assert float(log_prob.grad[i, t]) == pytest.approx(expected, rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("seed", SEEDS)
def test_rollout_mismatch_matches_a_plain_loop(seed):
    """Guards against mismatch metrics that count inserted/padding tokens or estimate the KL the wrong way."""
    gen, rows, cols, mask = random_case(seed)
    old = -2.0 + 0.5 * torch.randn(rows, cols, generator=gen)
    rollout = old + 0.4 * torch.randn(rows, cols, generator=gen)
    got = ca.rollout_mismatch(old, rollout, mask)
    diffs, k3 = [], []
    for i in range(rows):
        for t in range(cols):
            if mask[i, t]:
                diffs.append(abs(float(old[i, t] - rollout[i, t])))
                ratio = math.exp(float(old[i, t] - rollout[i, t]))  # pi_old / pi_rollout
                k3.append(ratio - 1 - math.log(ratio))
    assert got["logprob_diff_mean"] == pytest.approx(statistics.fmean(diffs) if diffs else 0.0, rel=1e-5, abs=1e-7)
    assert got["logprob_diff_max"] == pytest.approx(max(diffs, default=0.0), rel=1e-6)
    assert got["kl_k3"] == pytest.approx(statistics.fmean(k3) if k3 else 0.0, rel=1e-4, abs=1e-7)
