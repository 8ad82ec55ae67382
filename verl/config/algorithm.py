"""The ``algorithm`` section of the trainer's config (advantage estimator, in-reward KL and its controller, dynamic
sampling, overlong handling, turn-level credit), and the registry lookups every algorithm-valued setting takes its
allowed names from (here and in the actor's section, ``verl.config.sections``).

The names are read from the registries of ``verl.algorithms`` when the config is checked, not listed here: a name
registered by a recipe or a plug-in is then valid, and no list can fall behind (``verl/algorithms/registry.py``).
Each setting is declared once (``verl.config.schema.setting``), as in ``verl.config.sections``.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.config.compat import Alias
from verl.config.schema import section, setting


def _algorithms():
    """``verl.algorithms.core_algos``, imported on first use (torch): importing the package registers the built-in
    estimators and losses (``verl.algorithms.registry``)."""
    import verl.algorithms  # noqa: F401 -- registers core_algos' and turn_credit's entries
    from verl.algorithms import core_algos

    return core_algos


def adv_estimator_names() -> tuple[str, ...]:
    return _algorithms().ADV_ESTIMATORS.names()


def kl_estimator_names() -> tuple[str, ...]:
    return _algorithms().KL_ESTIMATORS.names()


def policy_loss_names() -> tuple[str, ...]:
    return _algorithms().POLICY_LOSSES.names()


def agg_mode_names() -> tuple[str, ...]:
    return _algorithms().AGG_MODES


def kl_controller_names() -> tuple[str, ...]:
    return _algorithms().KL_CONTROLLERS


@dataclass
class KLControlConfig:
    type: str = setting("fixed", "{choices} (adaptive: the Ziegler et al. 2019 controller).",
                        choices=kl_controller_names)
    kl_coef: float = setting(0.001, "Initial (or fixed) KL coefficient beta.", low=0)
    target_kl: float = setting(0.1, "Adaptive controller: target KL per sequence.", low=0, low_open=True,
                               what="the adaptive controller's target KL")
    horizon: int = setting(10000, "Adaptive controller: horizon in samples.")


@dataclass
class FilterGroupsConfig:
    enable: bool = setting(
        False, "Drop the groups whose samples all scored the same and generate more (needs a group adv_estimator).")
    metric: str = setting(
        "score", "What must differ within a group: score (the trajectory's reward before any KL term).",
        choices=("score",))
    max_num_gen_batches: int = setting(
        10, "Most generation rounds per step, the first included; a batch still short then is filled with dropped "
        "groups (logged as train/filled_groups). Logged each step: train/gen_rounds, train/kept_group_frac.", low=1,
        what="generation rounds per step, the first included (verl's 0 = unbounded is not offered: a dataset whose "
        "groups all score alike would never fill a batch)")


@dataclass
class OverlongConfig:
    mode: str = setting(
        "none", "Trajectories cut by a length budget (the recipe marks them; the search agent's stop reason "
        "max_length), verl/trainer/reward.py: none = trained as any other | mask = their loss_mask is zeroed: no "
        "policy, KL, entropy or value loss and no advantage whitening sees them (DAPO's overlong filtering; their "
        "score still counts in their GRPO/RLOO group's baseline) | soft_penalty = DAPO's soft overlong punishment, by "
        "length, added to every row's outcome reward (buffer_len, penalty_factor below). Logged each step: "
        "train/overlong_frac (share of rows cut), train/overlong_masked (rows masked), and with soft_penalty "
        "train/overlong_penalty (mean penalty per row).", choices=("none", "mask", "soft_penalty"),
        spellings=(Alias("reward_model.overlong_buffer.enable", values={True: "soft_penalty", False: "none"}),))
    buffer_len: int = setting(
        100, "soft_penalty: L_cache in tokens (verl: reward_model.overlong_buffer.len). A response of |y| tokens "
        "(sampled + inserted, as the budget counts) gets 0 up to data.max_trajectory_length - buffer_len, then a "
        "penalty growing linearly to -penalty_factor at data.max_trajectory_length. At most "
        "data.max_trajectory_length.", low=1, spellings=(Alias("reward_model.overlong_buffer.len"),))
    penalty_factor: float = setting(
        1.0, "soft_penalty: the penalty at the full budget, >= 0 (verl: reward_model.overlong_buffer.penalty_factor).",
        low=0, spellings=(Alias("reward_model.overlong_buffer.penalty_factor"),))


@dataclass
class AlgorithmConfig:
    adv_estimator: str = setting(
        "gae", "Advantage estimator, by its registered name (verl/algorithms/registry.py): {choices}. One that "
        "reads critic values (gae) trains a critic; a group estimator (grpo, rloo, ...) needs rollout.n >= 2; "
        "grpo_turn adds turn-level credit.", choices=adv_estimator_names)
    gamma: float = setting(1.0, "Discount factor.", low=0, high=1)
    lam: float = setting(1.0, "GAE lambda.", low=0, high=1)
    norm_adv_by_std_in_grpo: bool = setting(
        True, "GRPO: divide group-centred scores by the group's std (false = Dr. GRPO style).")
    use_kl_in_reward: bool = setting(False, "Subtract beta * KL(actor || reference) from the token rewards.")
    kl_penalty: str = setting("kl", "Estimator of the in-reward KL: {choices}.", choices=kl_estimator_names)
    kl_ctrl: KLControlConfig = section(KLControlConfig)
    filter_groups: FilterGroupsConfig = section(
        FilterGroupsConfig, "Dynamic sampling (DAPO; group estimators only): groups whose samples all got the same "
        "score give zero advantage and are dropped; more prompts are generated until data.train_batch_size groups "
        "are kept (verl's key names).")
    turn_reward_coef: float = setting(
        0.0, "Turn-level credit (verl.algorithms.turn_credit): the reward's per-turn scores (e.g. retrieval_hit of "
        "each search) times this are added to the token reward on the last policy token of their turn (GAE carries "
        "them back).", low=0, what="a coefficient")
    turn_adv_coef: float = setting(
        1.0, "adv_estimator=grpo_turn: weight of the step advantage (turns of one prompt's samples at the same turn "
        "index, as in GiGPO) added to GRPO's outcome advantage on the tokens of that turn.", low=0,
        what="a coefficient")
    overlong: OverlongConfig = section(OverlongConfig)
