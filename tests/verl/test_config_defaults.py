"""Each setting is declared once (``verl.config.setting``), and everything else is made from the declarations.

Guards against a setting with two sources of truth drifting apart: a YAML default that disagrees with the dataclass
(code that builds a ``Config()`` would then disagree with what users read), an undocumented key, a choice list that
names a value nothing registers (or misses one a plug-in registered), a range check that a declaration forgot, and
a steering key that the run directory would not honour.
"""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from search_r1.config import SearchConfig
from search_r1.reward.qa_em import NORMALIZERS, SCORERS
from verl.algorithms.registry import ADV_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from verl.config import (
    DEFAULT_CONFIG,
    Config,
    ConfigError,
    allowed,
    check_settings,
    declared,
    leaves,
    load_config,
    steering_keys,
)
from verl.config.doc import doc_text


def leaf_map(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(leaf_map(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def test_the_yaml_holds_every_declared_key_with_its_default():
    """configs/ppo_trainer.yaml (the search recipe's BASE_CONFIG) loads to exactly the dataclass defaults."""
    yaml = leaf_map(OmegaConf.to_container(OmegaConf.load(DEFAULT_CONFIG), resolve=False))
    fields = leaf_map(OmegaConf.to_container(OmegaConf.structured(SearchConfig), resolve=False))
    assert yaml == fields


def test_every_setting_is_declared_with_a_doc():
    undeclared = [leaf.key for leaf in leaves(SearchConfig()) if leaf.setting is None or not leaf.setting.doc]
    assert undeclared == []


def test_registry_choices_are_read_from_the_registries():
    """The allowed names of the algorithm keys are the registries' (built-ins and anything registered)."""
    load_config()  # imports the algorithms and the recipe: their registrations are made
    now = {leaf.key: leaf.setting.allowed_choices() for leaf in leaves(SearchConfig())
           if leaf.setting.choices is not None}
    assert now["algorithm.adv_estimator"] == ADV_ESTIMATORS.names()
    assert now["algorithm.kl_penalty"] == now["actor_rollout_ref.actor.kl_loss_type"] == KL_ESTIMATORS.names()
    assert now["actor_rollout_ref.actor.policy_loss.loss_mode"] == POLICY_LOSSES.names()
    assert now["reward.default_scorer"] == tuple(SCORERS) and now["reward.normalize"] == tuple(NORMALIZERS)


@pytest.mark.parametrize("key", ["algorithm.adv_estimator", "actor_rollout_ref.actor.loss_agg_mode",
                                 "actor_rollout_ref.actor.policy_loss.loss_mode", "reward.default_scorer",
                                 "trainer.logger", "reward.terms"])
def test_the_documentation_lists_every_allowed_value(key):
    leaf = next(leaf for leaf in leaves(SearchConfig()) if leaf.key == key)
    load_config()
    for name in leaf.setting.allowed_choices():
        assert name in doc_text(leaf.setting) and name in allowed(leaf.setting, leaf.hint)


def test_every_declared_range_and_choice_is_checked():
    """A value just outside each declared range or choice list is refused, naming the key; the default passes."""
    cfg = load_config()
    check_settings(cfg)
    for leaf in leaves(cfg):
        s = leaf.setting
        bad = None
        if s.choices is not None and not isinstance(leaf.value, dict):
            bad = ["not-a-choice"] if isinstance(leaf.value, list) else "not-a-choice"
        elif s.low is not None and isinstance(leaf.value, int | float) and not isinstance(leaf.value, bool):
            bad = s.low - 1
        if bad is None:
            continue
        broken = load_config()
        *parents, name = leaf.key.split(".")
        node = broken
        for part in parents:
            node = getattr(node, part)
        setattr(node, name, bad)
        with pytest.raises(ConfigError, match=f"config key {leaf.key}"):
            check_settings(broken)


def test_steering_keys_come_from_the_declarations():
    keys = steering_keys(SearchConfig())
    assert {"trainer.total_training_steps", "trainer.logger", "retriever.url", "data.val_files",
            "trainer.default_local_dir"} <= keys
    assert "actor_rollout_ref.actor.optim.lr" not in keys and "algorithm.adv_estimator" not in keys
    assert steering_keys(Config()) == {k for k in keys if not k.startswith(("retriever.", "monitors."))}


def test_the_trainer_config_has_no_search_setting():
    """verl's Config holds the trainer's sections; the search keys are the search recipe's (search_r1.config)."""
    trainer_keys = {leaf.key.split(".")[0] for leaf in leaves(Config())}
    assert trainer_keys == {"recipe", "plugins", "data", "actor_rollout_ref", "critic", "algorithm",
                            "custom_reward_function", "trainer"}
    assert {"retriever", "max_turns", "do_search", "reward"} <= {leaf.key.split(".")[0] for leaf in
                                                                 leaves(SearchConfig())}
    assert declared(Config, "recipe").doc and Config.recipe == "search_r1.recipe"
