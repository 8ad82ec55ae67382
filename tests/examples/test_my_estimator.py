"""The example estimator (``examples/my_estimator.py``) against a plain loop; its run through ``plugins=[...]`` on the
entry point is ``tests/verl/trainer/test_second_recipe.py``'s."""

from __future__ import annotations

import numpy as np
import torch

from examples.my_estimator import NAME, reinforce_plus_plus_baseline
from verl.algorithms.registry import ADV_ESTIMATORS, AdvantageInputs


def test_registered_with_what_it_needs():
    """Guards against an estimator that reads group ids without declaring them (the config would let rollout.n=1
    through, and every row would be its own group)."""
    entry = ADV_ESTIMATORS.get(NAME)
    assert entry.fn is reinforce_plus_plus_baseline and entry.needs_groups and not entry.needs_critic


def test_matches_a_plain_loop():
    """Guards against a baseline taken over the wrong rows (another prompt's, the padding) or a whitening over the
    wrong tokens: each row's score minus its group's mean, on its policy tokens, whitened over all of them."""
    generator = torch.Generator().manual_seed(0)
    rows, tokens = 9, 7
    mask = (torch.rand(rows, tokens, generator=generator) > 0.3).float()  # [B, T]
    mask[:, 0] = 1
    rewards = torch.zeros(rows, tokens)  # [B, T]: the score on a row's last policy token
    scores = torch.randint(0, 3, (rows,), generator=generator).float()
    for i in range(rows):
        rewards[i, int(mask[i].nonzero().max())] = scores[i]
    uids = np.array(["a", "b", "a", "c", "b", "a", "c", "b", "a"], dtype=object)
    advantages, returns = reinforce_plus_plus_baseline(AdvantageInputs(rewards, mask, index=uids))

    centred = {}
    for i in range(rows):
        group = [float(scores[j]) for j in range(rows) if uids[j] == uids[i]]
        centred[i] = float(scores[i]) - sum(group) / len(group)
    values = [centred[i] for i in range(rows) for t in range(tokens) if mask[i, t]]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    for i in range(rows):
        for t in range(tokens):
            expected = (centred[i] - mean) / (var + 1e-8) ** 0.5 if mask[i, t] else 0.0
            assert abs(float(advantages[i, t]) - expected) < 1e-5, (i, t)
    assert torch.equal(advantages, returns)
