"""Registries of the algorithm families: a name maps to one function that declares what it needs.

An advantage estimator is one function decorated with ``register_adv_estimator``; the decorator says
whether it consumes critic values (the trainer then builds a critic), group ids (``uid``: rows of one
prompt share it, so ``rollout.n`` must be >= 2) and which ``algorithm.*`` keys it reads. Every estimator
takes one ``AdvantageInputs`` record, so the trainer calls them all the same way. KL estimators
(``actor.kl_loss_type``, ``algorithm.kl_penalty``) are registered with ``register_kl_estimator``. A policy
loss (``actor.policy_loss.loss_mode``) is one function registered with ``register_policy_loss``, which declares the
``actor.*`` keys it reads beyond the common ones; every loss takes one ``PolicyLossInputs`` record.

Everything that names an estimator asks these registries: the config's allowed values and its
critic and group-size rules (``verl.config``), the trainer's call (``verl.trainer.reward.compute_advantages``) and
the on-policy critic's targets (``returns_per_row``: ``CriticWorker.update_on_policy``).
Adding an estimator is therefore one decorated function and nothing else; a function registered in any
module imported before the config is loaded (a recipe, a test) is as valid as the built-ins, which
``verl.algorithms.core_algos`` registers on the registries' first use (``Registry.builtins_from``, set up by the
package). (verl's ``core_algos`` keys its registry by a StrEnum that types
the config field; a plain ``str`` is kept here so that registrations outside this package are valid
config values too.)

This module imports no torch (tensor types appear in annotations only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from verl.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> entries of one family, in registration order; an unknown name fails listing the valid ones.

    The built-in entries are registered on first use (``builtins_from``): the modules that define them import torch,
    and importing a registry (to check a config, before any model) must not."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, T] = {}
        self._load_builtins: Callable[[], None] | None = None

    def builtins_from(self, load: Callable[[], None] | None) -> None:
        """``load()`` registers the family's built-ins: called once, before the first lookup (None: none)."""
        self._load_builtins = load

    def _loaded(self) -> dict[str, T]:
        if self._load_builtins is not None:
            load, self._load_builtins = self._load_builtins, None
            load()
        return self._entries

    def add(self, name: str, entry: T) -> None:
        """Register ``entry`` under ``name``; a name already taken is an error (no silent shadowing)."""
        if name in self._entries:
            raise ValueError(f"{self.family} {name!r} is already registered")
        self._entries[name] = entry

    def get(self, name: str) -> T:
        if name not in self._loaded():
            raise ValueError(f"unknown {self.family} {name!r}: valid are {', '.join(self._entries)}")
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._loaded())

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()


# ----------------------------------------------------------------------------------------------
# Advantage estimators
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageInputs:
    """What the trainer hands an advantage estimator (B rows, T response tokens).

    Only what the estimator declared is filled: ``values`` with ``needs_critic``, ``index`` with
    ``needs_groups``, and ``config`` holds exactly the declared ``config_args`` (reading another key is a
    KeyError, so a declaration cannot fall behind its function).
    """

    token_level_rewards: Tensor  # [B, T] outcome score on the last policy token, minus beta * KL if in reward
    mask: Tensor  # [B, T] loss mask: 1 = a policy token that is trained, 0 = padding or inserted by the environment
    values: Tensor | None = None  # [B, T] critic values of the old policy (needs_critic)
    index: np.ndarray | None = None  # [B] uid per row, equal for the samples of one prompt (needs_groups)
    config: Mapping[str, Any] = field(default_factory=dict)  # {algorithm key: value} of the declared config_args
    turn_scores: Tensor | None = None  # [B, K] score of each row's policy turn k, NaN = unscored or past its turns
    turn_index: Tensor | None = None  # [B, T] long: the policy turn of each token, -1 off policy tokens (needs_turns)


AdvantageFn = Callable[[AdvantageInputs], "tuple[Tensor, Tensor]"]  # -> (advantages [B, T], returns [B, T])


@dataclass(frozen=True)
class AdvEstimator:
    """A registered advantage estimator and what it needs."""

    fn: AdvantageFn
    needs_critic: bool  # reads AdvantageInputs.values: the trainer builds a critic (and trains it on the returns)
    needs_groups: bool  # reads AdvantageInputs.index (the batch's uid): the config requires rollout.n >= 2
    config_args: tuple[str, ...]  # the algorithm.* keys it reads from AdvantageInputs.config
    needs_turns: bool = False  # reads AdvantageInputs.turn_scores / turn_index (verl.algorithms.turn_credit)
    # a row's returns depend on that row's rewards, values and mask only (GAE's): the critic's on-policy update may
    # then compute its targets itself from its own forward pass (config.computes_values_in_update)
    returns_per_row: bool = False


ADV_ESTIMATORS: Registry[AdvEstimator] = Registry("advantage estimator")


def register_adv_estimator(name: str, *, needs_critic: bool = False, needs_groups: bool = False,
                           config_args: tuple[str, ...] = (), needs_turns: bool = False,
                           returns_per_row: bool = False) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register ``fn(inputs: AdvantageInputs) -> (advantages, returns)`` as the config value
    ``algorithm.adv_estimator=name``, with what it needs (see ``AdvEstimator``)."""
    def register(fn: AdvantageFn) -> AdvantageFn:
        ADV_ESTIMATORS.add(name, AdvEstimator(fn, needs_critic, needs_groups, tuple(config_args), needs_turns,
                                              returns_per_row))
        return fn
    return register


# ----------------------------------------------------------------------------------------------
# Policy losses
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicyLossInputs:
    """What the actor hands a policy loss for one micro-batch (B rows, T response tokens).

    The settings every loss gets are fields; ``config`` holds exactly the ``actor_rollout_ref.actor.*`` keys the
    loss declared in its ``config_args`` (reading another is a KeyError, so a declaration cannot fall behind its
    function).
    """

    old_log_prob: Tensor  # [B, T] log pi_old of the sampled tokens, detached (the policy that generated them)
    log_prob: Tensor  # [B, T] log pi of the same tokens under the current weights; carries the gradient
    advantages: Tensor  # [B, T]
    mask: Tensor  # [B, T] loss mask: 1 = a policy token that is trained, 0 = padding or inserted by the environment
    clip_ratio_low: float  # actor.clip_ratio_low, else actor.clip_ratio: the ratio is kept >= 1 - clip_ratio_low
    clip_ratio_high: float  # actor.clip_ratio_high, else actor.clip_ratio: the ratio is kept <= 1 + clip_ratio_high
    clip_ratio_c: float | None = None  # dual-clip bound (> 1) for negative advantages; None = off
    loss_agg_mode: str = "token-mean"  # masked.agg_loss's mode (actor.loss_agg_mode)
    global_tokens: float | None = None  # policy tokens of the whole mini-batch (agg_loss); None = this micro-batch's
    global_seqs: float | None = None  # non-empty rows of the whole mini-batch (agg_loss); None = this micro-batch's
    token_weights: Tensor | None = None  # [B, T] detached per-token weights (actor.tis_cap); None = 1
    config: Mapping[str, Any] = field(default_factory=dict)  # {actor key: value} of the declared config_args


PolicyLossFn = Callable[[PolicyLossInputs], "tuple[Tensor, dict[str, Tensor]]"]  # -> (scalar loss, detached metrics)


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss and what it reads beyond the fields of ``PolicyLossInputs``."""

    fn: PolicyLossFn
    config_args: tuple[str, ...]  # actor_rollout_ref.actor.* keys (dotted below it) it reads from inputs.config


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def policy_loss_config(loss: PolicyLoss, actor_cfg: Any) -> Mapping[str, Any]:
    """``{key: value}`` of the ``actor_rollout_ref.actor`` keys that ``loss`` declared (``config_args``, dotted below
    the actor: ``policy_loss.loss_mode``), read-only; ``ConfigError`` naming the loss when one is not an actor
    key. Called when the config is checked (``verl.config.rl.check_estimator``) and by the actor."""
    values, unknown = {}, []
    for key in loss.config_args:
        node = actor_cfg
        for part in key.split("."):
            if not hasattr(node, part):
                unknown.append(key)
                break
            node = getattr(node, part)
        else:
            values[key] = node
    if unknown:
        mode = actor_cfg.policy_loss.loss_mode
        raise ConfigError(f"config key actor_rollout_ref.actor.policy_loss.loss_mode={mode!r} is invalid: allowed a "
                          f"policy loss whose config_args are actor_rollout_ref.actor keys (it declares {unknown}, "
                          "which are not)")
    return MappingProxyType(values)



def register_policy_loss(name: str, *, config_args: tuple[str, ...] = ()) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register ``fn(inputs: PolicyLossInputs) -> (loss, metrics)`` as the config value
    ``actor_rollout_ref.actor.policy_loss.loss_mode=name``; ``config_args`` are the ``actor_rollout_ref.actor``
    keys it reads from ``inputs.config`` (e.g. ``("entropy_coeff",)``, ``("policy_loss.loss_mode",)``), checked by
    the actor when it starts."""
    def register(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES.add(name, PolicyLoss(fn, tuple(config_args)))
        return fn
    return register


# ----------------------------------------------------------------------------------------------
# KL estimators
# ----------------------------------------------------------------------------------------------

KLFn = Callable[["Tensor", "Tensor"], "Tensor"]  # (log_prob [B, T], ref_log_prob [B, T]) -> per-token KL [B, T]

KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")


def register_kl_estimator(name: str) -> Callable[[KLFn], KLFn]:
    """Decorator: register a per-token estimate of KL(pi || ref) as ``actor.kl_loss_type`` / ``algorithm.kl_penalty``
    ``name``."""
    def register(fn: KLFn) -> KLFn:
        KL_ESTIMATORS.add(name, fn)
        return fn
    return register

