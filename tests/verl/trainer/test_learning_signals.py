"""The learning-signal options together through the real entry point on Ray world 2 (tiny model, HF engines).

GSPO loss, the grpo_turn estimator fed by the retrieval_hit term, reward terms logged, dynamic sampling and
overlong masking in one run: it must train, exit 0, and log what each option did, consistently with the trained rows
that trainer.rollout_data_dir records.
"""

from __future__ import annotations

import json

import pytest

from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import RAY_WORLD_2, metrics, overrides

pytestmark = pytest.mark.slow


def test_every_learning_signal_option_in_one_run_on_two_ranks(workspace, tmp_path, ray_address):
    """Guards against an option that breaks the loop or the worker call path when combined with the others, and
    against metrics that do not describe the trained batch: train/overlong_masked equals the trained rows that the
    length budget cut, and reward/format is the mean of the format term over the trained rows."""
    out, dump = tmp_path / "run", tmp_path / "rollouts"
    done = main_ppo_in_process(*overrides(
        workspace, out, 2, *RAY_WORLD_2, "algorithm.adv_estimator=grpo_turn", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.clip_ratio_low=0.0003",
        "actor_rollout_ref.actor.clip_ratio_high=0.0004", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "reward.turn_term=retrieval_hit", "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=2", "algorithm.overlong.mode=mask",
        f"trainer.rollout_data_dir={dump}", "trainer.save_freq=-1"), ray_address=ray_address)  # driver: this process
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        rows = [json.loads(line) for line in (dump / f"{r['step']}.jsonl").read_text().splitlines()]
        assert len(rows) == 8
        cut = sum(row["stop_reason"] == "max_length" for row in rows)
        assert r["train/overlong_masked"] == cut and r["train/overlong_frac"] == cut / 8
        for term in ("em", "f1", "format", "retrieval_hit", "grounding"):
            assert 0.0 <= r[f"reward/{term}"] <= 1.0
        assert r["reward/retrieval_hit"] == 0.0  # do_search=false: every block is empty
        assert "actor/seq_ratio_mean" in r and 1 <= r["train/gen_rounds"] <= 2
