"""The config's defaults live in one documented place, ``configs/ppo_trainer.yaml``; the dataclasses of
``verl/config.py`` must mirror it exactly.

Guards against the two drifting apart: a default changed in one and not the other (code that builds a
``Config()`` or reads a dataclass default would then disagree with what users read in the YAML), a YAML
key with no field (the config would refuse its own defaults) or a field with no YAML key (an undocumented
setting).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import OmegaConf

from verl.config import CHOICES, DEFAULT_CONFIG, Config, choices, load_config


def yaml_defaults() -> dict[str, Any]:
    """configs/ppo_trainer.yaml alone, interpolations unresolved (as written)."""
    return OmegaConf.to_container(OmegaConf.load(DEFAULT_CONFIG), resolve=False)


def dataclass_defaults() -> dict[str, Any]:
    """The defaults of the Config dataclasses, interpolations unresolved."""
    return OmegaConf.to_container(OmegaConf.structured(Config), resolve=False)


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(leaves(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def same(a: Any, b: Any) -> bool:
    """Equal values of compatible types: an int in the YAML is a float field's value (16 and 16.0)."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


def test_every_yaml_key_is_a_field_and_every_field_a_yaml_key():
    yaml_keys, field_keys = set(leaves(yaml_defaults())), set(leaves(dataclass_defaults()))
    assert sorted(yaml_keys - field_keys) == [], "YAML keys without a dataclass field"
    assert sorted(field_keys - yaml_keys) == [], "dataclass fields missing from configs/ppo_trainer.yaml"


def test_every_dataclass_default_equals_the_yaml():
    yaml, fields = leaves(yaml_defaults()), leaves(dataclass_defaults())
    differ = {key: (fields[key], yaml[key]) for key in yaml.keys() & fields.keys() if not same(fields[key], yaml[key])}
    assert differ == {}, "dataclass default != YAML default (the YAML is the documented source: fix the dataclass)"


def test_default_config_builds_and_every_choice_key_exists():
    """Guards against a CHOICES key that names no field (its values would never be checked)."""
    cfg = load_config()
    for key in (*CHOICES, *choices()):
        obj = cfg
        for part in key.split("."):
            assert hasattr(obj, part), key
            obj = getattr(obj, part)
    assert dataclasses.is_dataclass(cfg)
