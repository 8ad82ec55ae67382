"""Overlong trajectories (``verl/trainer/reward.py``, ``algorithm.overlong``): masking and DAPO's soft penalty.

Guards against: masking that misses a cut row or touches a row the budget did not cut (or a token of one), a cut
row that still reaches a policy loss, a value loss or the advantage whitening, a soft penalty off its formula at the
edges of the buffer or placed on another token than the outcome score, and config errors that do not name the bad
value and the allowed ones.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import Tensor

from tests.verl.trainer.trainer_test_utils import metrics, overrides
from verl.algorithms import core_algos as ca
from verl.algorithms.registry import AdvantageInputs, register_adv_estimator
from verl.config import ConfigError, OverlongConfig, load_config
from verl.protocol import Batch
from verl.trainer.cli import split_args
from verl.trainer.main_ppo import build_trainer
from verl.trainer.reward import apply_overlong, last_token_index, soft_overlong_penalty

CUT = [False, True, False, True, True, False, False]  # which rows the length budget cut


def scored_batch(seed: int = 0, cut: list[bool] = CUT, cols: int = 10) -> Batch:
    """A scored batch as the trainer holds it after the reward: responses of random length with an inserted block
    (loss_mask 0) inside, the score on the last policy token, ``truncated`` per row."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(cut)
    response_mask = torch.zeros(rows, cols)
    loss_mask = torch.zeros(rows, cols)
    for i in range(rows):
        length = int(torch.randint(4, cols + 1, (1,), generator=gen))
        response_mask[i, :length] = 1.0
        loss_mask[i, :length] = 1.0
        start = int(torch.randint(1, length - 2, (1,), generator=gen))
        loss_mask[i, start:start + 2] = 0.0  # an inserted <information> block: context, not trained
    scores = torch.rand(rows, generator=gen)
    token_scores = torch.zeros(rows, cols)
    token_scores[torch.arange(rows), last_token_index(loss_mask)] = scores
    return Batch({"response_mask": response_mask, "loss_mask": loss_mask, "token_level_scores": token_scores},
                 {"truncated": list(cut), "score": scores.numpy(), "uid": [f"g{i // 2}" for i in range(rows)]})


def clone(batch: Batch) -> Batch:
    return Batch({k: v.clone() for k, v in batch.tensors.items()}, dict(batch.non_tensors), dict(batch.meta))


def test_mask_zeroes_exactly_the_cut_rows_and_nothing_else():
    before = scored_batch()
    after, logged = apply_overlong(clone(before), OverlongConfig(mode="mask"), max_trajectory_length=10)
    for i, cut in enumerate(CUT):
        expected = torch.zeros(10) if cut else before["loss_mask"][i]
        assert torch.equal(after["loss_mask"][i], expected), i
    assert torch.equal(after["token_level_scores"], before["token_level_scores"])
    assert torch.equal(after["response_mask"], before["response_mask"])
    assert logged == {"train/overlong_frac": pytest.approx(3 / 7), "train/overlong_masked": 3.0}


def test_none_changes_nothing_but_counts():
    before = scored_batch()
    after, logged = apply_overlong(clone(before), OverlongConfig(mode="none"), max_trajectory_length=10)
    for key in before.tensors:
        assert torch.equal(after[key], before[key]), key
    assert logged == {"train/overlong_frac": pytest.approx(3 / 7), "train/overlong_masked": 0.0}


def test_masked_cut_rows_are_in_no_loss_and_no_advantage_whitening():
    """After masking, the policy and value losses and the GAE advantages of the other rows are exactly those of the
    batch without the cut rows, for every aggregation; the cut rows get no advantage and no gradient."""
    masked, _ = apply_overlong(scored_batch(), OverlongConfig(mode="mask"), max_trajectory_length=10)
    kept = [i for i, cut in enumerate(CUT) if not cut]
    gen = torch.Generator().manual_seed(1)
    shape = masked["loss_mask"].shape
    old, adv, values = -torch.rand(shape, generator=gen), torch.randn(shape, generator=gen), torch.randn(shape)
    new = (old + 0.1 * torch.randn(shape, generator=gen)).requires_grad_()
    vpred = torch.randn(shape, generator=gen).requires_grad_()

    def losses(rows, mask: Tensor, mode: str) -> Tensor:
        pg, _ = ca.compute_policy_loss(ca.PolicyLossInputs(old[rows], new[rows], adv[rows], mask, 0.2, 0.28, 3.0,
                                                           mode))
        vf, _ = ca.compute_value_loss(vpred[rows], values[rows], adv[rows], mask, 0.5, mode)
        return pg + vf

    for mode in ca.AGG_MODES:
        full = losses(slice(None), masked["loss_mask"], mode)
        torch.testing.assert_close(full, losses(kept, masked["loss_mask"][kept], mode))
        g_new, g_vpred = torch.autograd.grad(full, (new, vpred))
        cut = torch.tensor(CUT)
        assert (g_new[cut] == 0).all() and (g_vpred[cut] == 0).all() and (g_new[~cut] != 0).any()

    def gae(batch_rows, mask: Tensor) -> Tensor:
        inputs = AdvantageInputs(masked["token_level_scores"][batch_rows], mask, values=values[batch_rows],
                                 config={"gamma": 1.0, "lam": 0.95})
        return ca.compute_gae_advantage_return(inputs)[0]

    advantages = gae(slice(None), masked["loss_mask"])
    torch.testing.assert_close(advantages[kept], gae(kept, masked["loss_mask"][kept]))
    assert (advantages[torch.tensor(CUT)] == 0).all()


def dapo_penalty(length: int, max_length: int, buffer_len: int, factor: float) -> float:
    """The formula as DAPO writes it, case by case."""
    expected = max_length - buffer_len
    if length <= expected:
        return 0.0
    if length <= max_length:
        return factor * (expected - length) / buffer_len
    return -factor


@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_soft_penalty_equals_the_formula_at_the_boundaries(factor):
    """L_max = 20, L_cache = 5: 0 up to and at 15, linear inside the buffer, -factor at 20 and beyond."""
    lengths = [0, 14, 15, 16, 18, 19, 20, 21, 40]
    got = soft_overlong_penalty(torch.tensor(lengths), max_length=20, buffer_len=5, penalty_factor=factor)
    assert got.tolist() == pytest.approx([dapo_penalty(n, 20, 5, factor) for n in lengths])
    assert got.tolist() == pytest.approx([0, 0, 0, -0.2 * factor, -0.6 * factor, -0.8 * factor, -factor, -factor,
                                          -factor])


def test_soft_penalty_is_added_to_the_outcome_reward_on_the_last_policy_token():
    """Every row is penalised by its response length (sampled + inserted tokens, cut or not), on the token that holds
    its score; the task score column and the loss mask stay as they were."""
    before = scored_batch(seed=2)
    cfg = OverlongConfig(mode="soft_penalty", buffer_len=4, penalty_factor=1.0)
    after, logged = apply_overlong(clone(before), cfg, max_trajectory_length=10)
    lengths = before["response_mask"].sum(-1)
    penalties = []
    for i in range(len(CUT)):
        last = max(t for t in range(10) if before["loss_mask"][i, t] != 0)
        penalty = dapo_penalty(int(lengths[i]), 10, 4, 1.0)
        penalties.append(penalty)
        expected = before["token_level_scores"][i].clone()
        expected[last] += penalty
        torch.testing.assert_close(after["token_level_scores"][i], expected)
    assert any(p < 0 for p in penalties) and any(p == 0 for p in penalties)  # the case covers both sides
    assert torch.equal(after["loss_mask"], before["loss_mask"]) and np.array_equal(after["score"], before["score"])
    assert logged["train/overlong_penalty"] == pytest.approx(float(np.mean(penalties)))
    assert logged["train/overlong_masked"] == 0.0


def test_config_errors_name_the_bad_value_and_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"algorithm\.overlong\.mode='drop' is invalid: allowed one of none, mask, "
                                          r"soft_penalty"):
        load_config(["algorithm.overlong.mode=drop"])
    with pytest.raises(ConfigError, match=r"algorithm\.overlong\.buffer_len=5000 is invalid: allowed at most "
                                          r"data\.max_trajectory_length=4096 with algorithm\.overlong\."
                                          r"mode=soft_penalty"):
        load_config(["algorithm.overlong.mode=soft_penalty", "algorithm.overlong.buffer_len=5000"])
    with pytest.raises(ConfigError, match=r"algorithm\.overlong\.buffer_len=0 is invalid: allowed an integer >= 1"):
        load_config(["algorithm.overlong.buffer_len=0"])
    with pytest.raises(ConfigError, match=r"algorithm\.overlong\.penalty_factor=-1\.0 is invalid: allowed a number "
                                          r">= 0"):
        load_config(["algorithm.overlong.mode=soft_penalty", "algorithm.overlong.penalty_factor=-1.0"])
    assert load_config(["algorithm.overlong.buffer_len=600"]).algorithm.overlong.mode == "none"  # unused: not checked
    cfg = load_config(["algorithm.overlong.mode=soft_penalty", "algorithm.overlong.buffer_len=500"])
    assert (cfg.algorithm.overlong.mode, cfg.algorithm.overlong.buffer_len) == ("soft_penalty", 500)


MASKS: list[Tensor] = []  # the loss mask each training step handed the advantage estimator


@register_adv_estimator("records_mask_for_overlong_test")
def records_mask(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Advantage +1 on every counted token (any non-zero advantage will do); records the mask."""
    MASKS.append(inputs.mask.clone())
    return inputs.mask.clone(), inputs.mask.clone()


@pytest.mark.slow
def test_a_training_step_masks_exactly_the_rows_the_search_loop_cut(workspace, tmp_path):
    """Through PPOTrainer.fit with the search recipe: the same seeded step with mode none and mode mask; the mask that
    reaches the estimator differs exactly on the rows whose stop reason is max_length (zeroed), and the step logs
    their share and count."""
    stop_reasons, logged = [], []
    for mode in ("none", "mask"):
        out = tmp_path / mode
        files, args = split_args(overrides(workspace, out, 1, f"algorithm.overlong.mode={mode}",
                                           "algorithm.adv_estimator=records_mask_for_overlong_test",
                                           "data.max_trajectory_length=20", f"trainer.rollout_data_dir={out / 'rows'}"))
        build_trainer(load_config(args, files)).fit()
        rows = [json.loads(line) for line in (out / "rows" / "1.jsonl").read_text().splitlines()]
        stop_reasons.append([row["stop_reason"] for row in rows])
        (record,) = metrics(out)
        logged.append(record)
    assert stop_reasons[0] == stop_reasons[1]  # the same trajectories: only the mode differs
    cut = torch.tensor([reason == "max_length" for reason in stop_reasons[0]])
    assert 0 < int(cut.sum()) < len(cut), "the case needs cut and uncut rows"
    unmasked, masked = MASKS[-2:]
    assert (masked[cut] == 0).all() and (unmasked[cut] != 0).any(dim=-1).all()
    assert torch.equal(masked[~cut], unmasked[~cut])
    for record in logged:
        assert record["train/overlong_frac"] == pytest.approx(float(cut.float().mean()))
    assert (logged[0]["train/overlong_masked"], logged[1]["train/overlong_masked"]) == (0.0, float(cut.sum()))
