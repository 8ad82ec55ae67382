"""Dynamic sampling (``algorithm.filter_groups``): zero-variance groups dropped, the batch kept full.

The filter on hand-packed trajectories (``pack_trajectories``, rounds of different widths), and through the real
entry point: GRPO on Ray world 2 with the pipelined rollout, a reward that is constant for half of the prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import RAY_WORLD_2, metrics, overrides
from verl.config import ConfigError, load_config
from verl.protocol import Batch
from verl.trainer.pipeline import Generated, concat_trajectories, constant_groups, fill_batch
from verl.utils.seq import pack_trajectories

PAD = 0


def test_constant_groups_are_exactly_the_groups_of_equal_scores():
    """Guards against a tolerance that drops groups with a small but real spread, and against groups mixed up when
    their rows are not consecutive."""
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "e", "d", "e"], dtype=object)
    scores = np.array([1.0, 1.0, 0.0, 1e-7, 0.3, 0.3, 0.0, 1.0, 0.0, 0.5])
    assert constant_groups(uids, scores).tolist() == [True, True, False, False, True, True, True, False, True, False]


def _round(tag: int, scores: list[list[float]], lengths: tuple[int, int]) -> Batch:
    """A packed round: one group of 2 rows per entry of ``scores``; prompt / response lengths vary with ``tag``."""
    groups = len(scores)
    prompt_ids, response_ids, info = [], [], []
    for g in range(groups):
        for s in range(2):
            p = lengths[0] + (g + s) % 3
            r = lengths[1] + (2 * g + s) % 4
            prompt_ids.append([100 * tag + g + 1] * p)
            response_ids.append([50 + tag * 10 + g + s] * r)
            info.append([1, 0] * (r // 2) + [1] * (r % 2))
    tensors = pack_trajectories(prompt_ids, response_ids, info, pad_id=PAD)
    tensors["token_level_scores"] = torch.rand(tensors["responses"].shape)
    uids = [f"row{tag * 10 + g}" for g in range(groups) for _ in range(2)]
    return Batch(tensors, {"uid": uids, "score": np.array([x for g in scores for x in g])}, {"round": tag})


def _unpadded(batch: Batch, row: int) -> tuple[list[int], list[int]]:
    prompt = batch["prompts"][row][batch["attention_mask"][row, :batch["prompts"].shape[1]].bool()].tolist()
    response = batch["responses"][row][batch["response_mask"][row].bool()].tolist()
    return prompt, response


def test_fill_batch_keeps_the_size_and_drops_exactly_the_constant_groups():
    """Guards against dropped groups that vary, kept groups that do not, a batch that shrinks or grows, rows cut or
    shifted when rounds of different widths are joined, and a second round sampled with the first round's uids."""
    rounds = [_round(0, [[1, 1], [0, 1], [0, 0], [0.5, 0.2]], (3, 5)),  # keeps 2 of 4
              _round(1, [[0, 0], [1, 1], [0, 0], [1, 1]], (6, 2)),  # keeps 0
              _round(2, [[0, 1], [1, 0], [1, 1], [0, 1]], (2, 9))]  # keeps 3 -> 5 kept, the first 4 are taken
    asked = []

    def generate(prompts, r):
        asked.append((prompts["tag"][0], r))
        return Generated(rounds[r].index(slice(None)), prompts, {"agent/round": float(r)})

    draws = iter([Batch(non_tensors={"tag": [t] * 4}) for t in (1, 2, 3)])
    result = fill_batch(Batch(non_tensors={"tag": [0] * 4}), lambda: next(draws), generate, groups=4, max_rounds=5,
                        pad_id=PAD)
    assert asked == [(0, 0), (1, 1), (2, 2)]
    batch = result.batch
    assert len(batch) == 8 and list(batch["uid"]) == ["row1"] * 2 + ["row3"] * 2 + ["row20#2"] * 2 + ["row21#2"] * 2
    assert not constant_groups(batch["uid"], batch["score"]).any()
    # the step logs the first round's generation metrics with the filter's
    assert result.metrics == {"agent/round": 0.0, "train/gen_rounds": 3.0, "train/kept_group_frac": 5 / 12,
                              "train/filled_groups": 0.0}
    assert len(result.prompts) == 12
    sources = [(0, 2), (0, 3), (0, 6), (0, 7), (2, 0), (2, 1), (2, 2), (2, 3)]  # (round, row) of each kept row
    for row, (r, src) in enumerate(sources):
        assert _unpadded(batch, row) == _unpadded(rounds[r], src)
        real = batch["response_mask"][row].bool()
        torch.testing.assert_close(batch["token_level_scores"][row][real],
                                   rounds[r]["token_level_scores"][src][rounds[r]["response_mask"][src].bool()])
        assert batch["info_mask"][row][real].tolist() == rounds[r]["info_mask"][src][
            rounds[r]["response_mask"][src].bool()].tolist()
    P = batch["prompts"].shape[1]
    assert torch.equal(batch["input_ids"][:, :P], batch["prompts"]) and torch.equal(batch["input_ids"][:, P:],
                                                                                     batch["responses"])
    want_pos = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
    assert torch.equal(batch["position_ids"], want_pos)


def test_fill_batch_fills_a_short_batch_with_dropped_groups_after_the_last_round():
    """Guards against an unbounded loop on data whose groups all score alike, and against a short batch (its size
    must stay data.train_batch_size x n for the mini-batches and the ranks)."""
    rounds = [_round(0, [[1, 1], [0, 1], [0, 0], [1, 1]], (3, 5)), _round(1, [[0, 0], [1, 1], [0, 0], [1, 1]], (4, 4))]
    result = fill_batch(Batch(non_tensors={"tag": [0] * 4}), lambda: Batch(non_tensors={"tag": [1] * 4}),
                        lambda p, r: Generated(rounds[r].index(slice(None)), p), groups=4, max_rounds=2, pad_id=PAD)
    assert list(result.batch["uid"][::2]) == ["row1", "row0", "row2", "row3"]  # kept first, then dropped in order
    assert result.metrics == {"train/gen_rounds": 2.0, "train/kept_group_frac": 1 / 8, "train/filled_groups": 3.0}


def test_concat_of_one_round_is_that_round():
    one = _round(0, [[0, 1]], (2, 3))
    assert concat_trajectories([one], PAD) is one


@pytest.mark.parametrize("bad, needle", [
    (["algorithm.adv_estimator=gae", "algorithm.filter_groups.enable=true"], "needs a group estimator"),
    (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "algorithm.filter_groups.enable=true",
      "algorithm.filter_groups.max_num_gen_batches=0"], "max_num_gen_batches"),
    (["algorithm.filter_groups.metric=acc"], "score"),
])
def test_bad_filter_settings_name_the_key(bad, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(bad)


REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Constant 0.5 for even dataset rows (their groups have zero variance), the share of letters 'e' for odd."""
    row = int(ground_truth["target"][0].split()[-1])
    return 0.5 if row % 2 == 0 else solution_str.count("e") / max(len(solution_str), 1)
'''


@pytest.mark.slow
def test_grpo_with_dynamic_sampling_on_two_ranks_trains_only_groups_that_vary(workspace, tmp_path, ray_address):
    """Guards against the filter being skipped or mis-applied in the real loop (Ray world 2, pipelined rollout: the
    filter runs in the producer thread): every step trains data.train_batch_size groups of rollout.n rows, none of
    an even row (constant reward) unless a step had to fill, and the metrics say how many rounds it took."""
    reward, out, dump = tmp_path / "reward.py", tmp_path / "run", tmp_path / "rollouts"
    reward.write_text(REWARD)
    done = main_ppo_in_process(*overrides(
        workspace, out, 3, *RAY_WORLD_2, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=6",
        f"custom_reward_function.path={reward}", "trainer.max_staleness=1", "actor_rollout_ref.actor.tis_cap=2",
        f"trainer.rollout_data_dir={dump}", "trainer.save_freq=-1"), ray_address=ray_address)  # driver: here
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        rows = [json.loads(line) for line in (Path(dump) / f"{r['step']}.jsonl").read_text().splitlines()]
        assert len(rows) == 8 and len({row["group"] for row in rows}) == 4
        groups, index = {}, {}
        for row in rows:
            groups.setdefault(row["group"], []).append(row["score"])
            index[row["group"]] = row["index"]
        constant = sum(max(s) == min(s) for s in groups.values())
        assert constant == r["train/filled_groups"], (r, groups)
        even = [group for group in groups if index[group] % 2 == 0]
        assert len(even) <= r["train/filled_groups"], (r, groups)
        assert 1 <= r["train/gen_rounds"] <= 6 and 0 <= r["train/kept_group_frac"] <= 1
    assert any(r["train/gen_rounds"] >= 2 for r in records)  # half the groups are constant: one round rarely fills
