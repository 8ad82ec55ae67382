"""Adding an advantage estimator is one registered function and nothing else.

The estimators below are registered in this file only: no config choice, trainer argument map or critic rule
names them. Guards against a name list that the registry does not feed (the config's allowed values, whether a
critic is built, the group-size rule, the arguments the trainer passes): a new estimator would then be refused
by the config, get the wrong inputs, or train with a critic it never reads.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from tests.verl.trainer.trainer_test_utils import metrics, overrides
from tests.verl.workers.worker_test_utils import add_targets, make_config, random_batch
from verl.algorithms.core_algos import AdvantageInputs, masked_mean, register_adv_estimator
from verl.config import ConfigError, load_config, uses_critic
from verl.trainer.cli import split_args
from verl.trainer.main_ppo import build_trainer

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

CALLS: list[tuple[AdvantageInputs, Tensor]] = []  # what the trainer handed the estimator, and what it returned


@register_adv_estimator("sign_reinforce", config_args=("gamma",))
def sign_of_score_reinforce(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE whose advantage is the sign of the row's score minus the batch mean: +1 above, -1 below."""
    scores = inputs.token_level_rewards.sum(dim=-1)  # [B]
    advantages = torch.sign(scores - scores.mean())[:, None] * inputs.mask  # [B, T]
    CALLS.append((inputs, advantages))
    return advantages, advantages


@register_adv_estimator("needs_groups_for_test", needs_groups=True)
@register_adv_estimator("needs_critic_for_test", needs_critic=True)
@register_adv_estimator("reads_no_such_key_for_test", config_args=("gama",))
def zero_advantage(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Advantages 0 everywhere (only the declarations matter for the config tests)."""
    zeros = torch.zeros_like(inputs.token_level_rewards)  # [B, T]
    return zeros, zeros


def test_registered_estimator_trains_a_step(workspace, tmp_path):
    """One real step through PPOTrainer with the estimator registered above: the config accepts the name, no
    critic is built, the estimator gets exactly what it declared, and the step trains on its advantages."""
    out = tmp_path / "run"
    files, args = split_args(overrides(workspace, out, 1, "algorithm.adv_estimator=sign_reinforce",
                                       "algorithm.gamma=0.97"))
    cfg = load_config(args, files)
    assert not uses_critic(cfg)
    trainer = build_trainer(cfg)
    assert trainer.critic is None
    trainer.fit()

    (inputs, advantages), = CALLS
    assert inputs.values is None and inputs.index is None and dict(inputs.config) == {"gamma": 0.97}
    assert set(advantages[inputs.mask != 0].tolist()) <= {-1.0, 0.0, 1.0} and advantages.abs().sum() > 0
    record, = metrics(out)
    assert record["critic/advantages/mean"] == pytest.approx(float(masked_mean(advantages, inputs.mask)), abs=1e-6)
    assert "actor/pg_loss" in record and not any(key.startswith("critic/vf") for key in record)


def test_config_rules_come_from_the_declarations():
    """The allowed values, the critic and the group-size rule follow what each registration declares."""
    with pytest.raises(ConfigError, match=r"algorithm\.adv_estimator='nope' is invalid: allowed one of gae, .*"
                                          r"sign_reinforce"):
        load_config(["algorithm.adv_estimator=nope"])
    assert uses_critic(load_config(["algorithm.adv_estimator=needs_critic_for_test"]))
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.n=1 is invalid: allowed >= 2 with "
                                          r"algorithm\.adv_estimator=needs_groups_for_test"):
        load_config(["algorithm.adv_estimator=needs_groups_for_test"])
    assert not uses_critic(load_config(["algorithm.adv_estimator=needs_groups_for_test",
                                        "actor_rollout_ref.rollout.n=2"]))
    with pytest.raises(ConfigError, match=r"algorithm\.adv_estimator='reads_no_such_key_for_test'.*\['gama'\]"):
        load_config(["algorithm.adv_estimator=reads_no_such_key_for_test"])


def test_a_policy_loss_registered_here_is_a_config_value_and_the_actors_loss(tiny_model_dir):
    """Guards against a policy loss that needs edits beyond its one registered function: the config accepts its
    name, refuses an unknown one listing the registered ones, and the actor's update calls it."""
    from verl.algorithms.core_algos import compute_policy_loss
    from verl.algorithms.registry import POLICY_LOSSES, PolicyLossInputs, register_policy_loss
    from verl.workers.actor import ActorWorker

    calls = []
    if "halved_vanilla" not in POLICY_LOSSES:
        @register_policy_loss("halved_vanilla")
        def halved(inputs: PolicyLossInputs):
            calls.append(inputs)
            loss, metrics = compute_policy_loss(inputs)
            return 0.5 * loss, metrics
    with pytest.raises(ConfigError, match=r"policy_loss.loss_mode='nope'.*vanilla, gspo(, [a-z_]+)*, halved_vanilla"):
        load_config(["actor_rollout_ref.actor.policy_loss.loss_mode=nope"])
    cfg = make_config(tiny_model_dir, "actor_rollout_ref.actor.policy_loss.loss_mode=halved_vanilla")
    ActorWorker(cfg, total_steps=1).update_actor(add_targets(random_batch(seed=3), seed=3))
    assert calls and all(isinstance(inputs, PolicyLossInputs) for inputs in calls)  # every micro-batch's loss
    assert all(dict(inputs.config) == {} for inputs in calls)  # declared no actor key: none handed over
