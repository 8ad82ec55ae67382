"""Turn-level credit: turns found from the masks, turn rewards on the right tokens, the grpo_turn estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.algorithms import core_algos
from verl.algorithms.registry import AdvantageInputs
from verl.algorithms.turn_credit import place_turn_rewards, scores_tensor, turn_index

# Two rows of 12 response tokens. 1 = sampled by the policy, 0 = inserted (information, feedback) or padding.
POLICY = torch.tensor([
    [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0],  # turns at 0-2, 5-6, 10; padding at 11
    [1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0],  # turns at 0-1, 5-8; padding 9-11
])


def test_turns_are_the_runs_of_policy_tokens():
    assert turn_index(POLICY).tolist() == [[0, 0, 0, -1, -1, 1, 1, -1, -1, -1, 2, -1],
                                           [0, 0, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1]]


def test_turn_rewards_land_on_each_turns_last_policy_token_and_never_on_inserted_ones():
    """Guards against a turn reward on an inserted token (no gradient or value target there) or on the turn's first
    token, and against a row with fewer scores than turns shifting them."""
    placed = place_turn_rewards([[0.5, float("nan"), 2.0], [3.0]], POLICY)  # NaN: an unscored turn gets nothing
    want = torch.zeros(2, 12)
    want[0, 2], want[0, 10], want[1, 1] = 0.5, 2.0, 3.0
    assert torch.equal(placed, want)
    assert not placed[POLICY == 0].any()
    with pytest.raises(ValueError, match="row 1: 3 turn scores for 2 policy turns"):
        place_turn_rewards([[], [1.0, 1.0, 1.0]], POLICY)


def test_grpo_turn_equals_its_formula_on_a_seeded_case():
    """Guards against step groups that mix prompts or turn indices, unscored turns (NaN) counted in a step group or
    given a step advantage, a baseline for a step group of one, and step advantages on tokens of another turn: every
    token's advantage is recomputed here with explicit loops."""
    gen = torch.Generator().manual_seed(0)
    B, T = 6, 10
    policy = (torch.rand(B, T, generator=gen) > 0.3).long()
    policy[:, 0] = 1
    uids = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    turns = turn_index(policy)
    n_turns = (turns.max(1).values + 1).tolist()
    rows = [torch.rand(n, generator=gen).round(decimals=1).tolist() for n in n_turns]
    for i, row in enumerate(rows):  # unscored turns (a turn that did not search): in no step group
        for k in range(len(row)):
            if (i + k) % 3 == 2:
                row[k] = float("nan")
    outcome = torch.zeros(B, T)
    scores = torch.rand(B, generator=gen)
    for i in range(B):
        outcome[i, int(torch.nonzero(policy[i])[-1])] = scores[i]
    coef, eps = 0.7, 1e-6
    estimator = core_algos.ADV_ESTIMATORS.get("grpo_turn")
    assert estimator.needs_turns and estimator.needs_groups
    adv, _ = estimator.fn(AdvantageInputs(outcome, policy.float(), index=uids, turn_index=turns,
                                          turn_scores=scores_tensor(rows, turns),
                                          config={"norm_adv_by_std_in_grpo": True, "turn_adv_coef": coef}))
    for i in range(B):
        group = [j for j in range(B) if uids[j] == uids[i]]
        g_scores = [float(scores[j]) for j in group]
        out = 0.0 if len(group) < 2 else (float(scores[i]) - np.mean(g_scores)) / (np.std(g_scores, ddof=1) + eps)
        if len(group) < 2:
            out = float(scores[i])
        for t in range(T):
            if not policy[i, t]:
                assert adv[i, t] == 0
                continue
            k = int(turns[i, t])
            peers = [rows[j][k] for j in group if len(rows[j]) > k and not np.isnan(rows[j][k])]
            scored = len(rows[i]) > k and not np.isnan(rows[i][k])
            step = 0.0
            if scored and len(peers) >= 2:
                step = (rows[i][k] - np.mean(peers)) / (np.std(peers, ddof=1) + eps)
            assert float(adv[i, t]) == pytest.approx(out + coef * step, abs=1e-4), (i, t)


def test_grpo_turn_without_turn_scores_is_grpo():
    """Guards against the step term leaking into a batch that has no turn scores (every turn scores 0)."""
    gen = torch.Generator().manual_seed(1)
    policy = torch.ones(4, 5)
    rewards = torch.zeros(4, 5)
    rewards[:, -1] = torch.rand(4, generator=gen)
    uids = np.array(["x", "x", "y", "y"], dtype=object)
    turns = turn_index(policy)
    cfg = {"norm_adv_by_std_in_grpo": True, "turn_adv_coef": 1.0}
    got, _ = core_algos.ADV_ESTIMATORS.get("grpo_turn").fn(AdvantageInputs(
        rewards, policy, index=uids, turn_index=turns, turn_scores=scores_tensor([[]] * 4, turns), config=cfg))
    want, _ = core_algos.compute_grpo_outcome_advantage(AdvantageInputs(rewards, policy, index=uids, config=cfg))
    assert torch.equal(got, want)
