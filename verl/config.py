"""Typed, validated configuration: the recipe's YAML of defaults + ``--config`` files + ``key=value`` -> a ``Config``.

Choices:
- **The trainer knows no task.** ``Config`` holds the trainer's sections (data, actor_rollout_ref, critic,
  algorithm, custom_reward_function, trainer; ``verl.config_sections``, the algorithm's ``verl.config_algorithm``)
  and two keys that choose code: ``recipe`` (a module name: the task) and ``plugins`` (modules imported first). The
  recipe module declares its config class (``CONFIG_CLASS``, a subclass of ``Config`` adding the task's sections;
  default ``Config``) and its YAML of defaults (``BASE_CONFIG``; default none: the dataclass defaults); for example
  the search recipe's are ``search_r1.config.SearchConfig`` and ``configs/ppo_trainer.yaml``. ``recipe`` defaults
  to the one recipe the installed packages register (``installed_recipe``), so the trainer names no task.
- **Code before keys.** ``load_config`` first reads ``recipe`` and ``plugins`` from the files and overrides, imports
  each plug-in and then the recipe module, and only then merges and checks the config against the recipe's class:
  whatever those modules register (an advantage estimator, a policy loss, a reward term) is then a valid value.
- **One declaration per setting** (``verl.config_schema``): default, doc, allowed values and other spellings are
  the field's; ``validate`` is one walk of those declarations (``check_settings``) and then the config class's
  ``check`` (rules between keys; a subclass calls ``super().check()``).
- OmegaConf merges the layers in struct mode, so an unknown key fails naming the key; types are checked by
  OmegaConf. Other trainers' spellings are translated first (``verl.config_compat``). Library code receives the
  typed objects and never falls back to defaults of its own.
"""

from __future__ import annotations

import importlib
import importlib.resources
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from verl import config_checks
from verl.config_algorithm import AlgorithmConfig, FilterGroupsConfig, KLControlConfig, OverlongConfig
from verl.config_checks import (
    adv_estimator,
    max_sequence_length,
    recomputes_old_log_probs,
    rollout_world_size,
    trajectories_per_step,
    uses_critic,
    uses_lora,
    uses_reference,
    world_size,
)
from verl.config_compat import CompatError, rules, translate
from verl.config_schema import check_settings, did_you_mean, section, setting
from verl.config_sections import (
    DTYPE_NAMES,
    LOGGERS,
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    CriticModelConfig,
    CustomRewardConfig,
    DataConfig,
    FSDPConfig,
    ModelConfig,
    MultiTurnConfig,
    OptimConfig,
    PolicyLossConfig,
    RefConfig,
    RefFSDPConfig,
    RolloutConfig,
    TrainerConfig,
    ValKwargs,
)
from verl.errors import ConfigError
from verl.tools import default_format

__all__ = [  # the sections and helpers are re-exported: callers import them from here
    "DTYPE_NAMES", "LOGGERS", "ActorConfig", "ActorRolloutRefConfig", "AlgorithmConfig", "Config", "ConfigError",
    "CriticConfig", "CriticModelConfig", "CustomRewardConfig", "DataConfig", "FSDPConfig", "FilterGroupsConfig",
    "KLControlConfig", "ModelConfig", "MultiTurnConfig", "OptimConfig", "OverlongConfig", "PolicyLossConfig",
    "RefConfig", "RefFSDPConfig", "RolloutConfig", "TrainerConfig", "ValKwargs", "adv_estimator", "check_paths",
    "import_plugins", "load_config", "max_sequence_length", "recipe_config", "recipe_module",
    "recomputes_old_log_probs", "rollout_world_size", "run_name", "to_yaml", "trajectories_per_step", "uses_critic",
    "uses_lora", "uses_reference", "validate", "world_size",
]

logger = logging.getLogger(__name__)


def _config_dir() -> Path:
    """``configs/`` of a checkout (editable installs included), else the copy an installed wheel ships as the
    package data ``verl.configs`` (setup.py maps it there)."""
    checkout = Path(__file__).resolve().parent.parent / "configs"
    if (checkout / "ppo_trainer.yaml").is_file():
        return checkout
    return Path(str(importlib.resources.files("verl.configs")))


CONFIG_DIR = _config_dir()
DEFAULT_CONFIG = CONFIG_DIR / "ppo_trainer.yaml"  # the search recipe's defaults (its BASE_CONFIG), generated
DEMO_CONFIG = CONFIG_DIR / "demo.yaml"  # the embedded demo's paths and small values, layered over the defaults
RECIPES_GROUP = "verl.recipes"  # the entry-point group in which a package registers its recipe module


def registered_recipes() -> list[str]:
    """The recipe modules the installed packages register (entry points of ``RECIPES_GROUP``, e.g. setup.py's
    ``"verl.recipes": ["NAME = package.recipe"]``), sorted."""
    from importlib.metadata import entry_points

    return sorted({ep.value for ep in entry_points(group=RECIPES_GROUP)})


def installed_recipe() -> str:
    """The default of the key ``recipe``: the one registered recipe module; "" when none or several are registered
    (then ``recipe`` must be given)."""
    found = registered_recipes()
    return found[0] if len(found) == 1 else ""


@dataclass
class Config:
    """The trainer's config: the recipe and plug-ins, then the trainer's sections."""

    recipe: str = setting(
        installed_recipe(), "Python module that plugs the task into the generic trainer: its build_recipe(cfg, "
        "tokenizer, generator) returns the generation loop, the reward and the validation metrics "
        "(verl.trainer.recipe.Recipe); its CONFIG_CLASS names the config's keys (this file documents the default's). "
        "Default: the recipe the installed packages register (entry point group verl.recipes).")
    plugins: list[str] = setting(
        [], "Python modules imported before the config is checked (and in every worker), e.g. [my_estimators]: an "
        "advantage estimator, policy loss, KL estimator or reward term they register is then a valid value of its "
        "key.")
    data: DataConfig = section(DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig)
    critic: CriticConfig = section(CriticConfig)
    algorithm: AlgorithmConfig = section(AlgorithmConfig)
    custom_reward_function: CustomRewardConfig = section(CustomRewardConfig)
    trainer: TrainerConfig = section(TrainerConfig)

    def check(self) -> None:
        """The rules between keys (``verl.config_checks``); a recipe's subclass adds its own after
        ``super().check()``."""
        config_checks.check_trainer(self)

    def check_paths(self) -> None:
        """What a run needs when it starts (files exist; a subclass adds its own, e.g. a service's address)."""
        config_checks.check_paths(self)


def check_paths(cfg: Config) -> None:
    """The files (and, per recipe, services) the run needs are named and exist; ConfigError naming the key.
    Checked when a run starts, not in ``validate``, so configs can be built and checked anywhere."""
    cfg.check_paths()


def validate(cfg: Config) -> Config:
    """Every setting against its declaration, then the rules between keys; ConfigError naming the key."""
    check_settings(cfg)
    cfg.check()
    return cfg


# ------------------------------------------------------------------ the recipe and plug-in modules
def import_plugins(names: list[str]) -> None:
    """Import each module of ``plugins`` (what it registers becomes valid); ConfigError naming the key otherwise."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ConfigError(f"config key plugins={names!r} is invalid: module {name!r} cannot be imported ({err}); "
                              "allowed: modules importable from the Python path, e.g. plugins=[my_estimators] with "
                              "my_estimators.py in a directory on PYTHONPATH") from err


def recipe_module(name: str) -> ModuleType:
    """The module the config key ``recipe`` names; ConfigError naming the key when there is no such module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is None or not name.startswith(err.name):
            raise  # the recipe exists but one of its own imports is missing
        raise ConfigError(f"config key recipe={name!r}: no such module ({err})") from err


def recipe_config(name: str) -> tuple[type[Config], Path | None]:
    """(config class, YAML of defaults or None) that the recipe module ``name`` declares: ``CONFIG_CLASS`` (default
    ``Config``: the task has no keys of its own) and ``BASE_CONFIG`` (default None: the dataclass defaults)."""
    module = recipe_module(name)
    cls = getattr(module, "CONFIG_CLASS", Config)
    if not (isinstance(cls, type) and issubclass(cls, Config)):
        raise ConfigError(f"config key recipe={name!r}: its CONFIG_CLASS {cls!r} is not a subclass of "
                          "verl.config.Config (allowed: a dataclass `class TaskConfig(Config)` adding the task's "
                          "sections, or no CONFIG_CLASS)")
    base = getattr(module, "BASE_CONFIG", None)
    if base is not None and not Path(base).is_file():
        raise ConfigError(f"config key recipe={name!r}: its BASE_CONFIG {str(base)!r} is not a file (allowed: the "
                          "YAML of the recipe's defaults, or no BASE_CONFIG)")
    return cls, None if base is None else Path(base)


def _chosen(layers: list[list[tuple[str, Any]]]) -> tuple[str, list[str]]:
    """The ``recipe`` and ``plugins`` the layers set (a later layer wins; default: ``Config``'s)."""
    recipe, plugins = Config.recipe, Config().plugins
    for pairs in layers:
        for key, value in pairs:
            key = key.lstrip("+")
            if key == "recipe":
                recipe = value
            elif key == "plugins":
                plugins = value
    if recipe == "":
        found = registered_recipes()
        raise ConfigError(f"config key recipe is not set, and the installed packages register {len(found)} recipes "
                          f"({', '.join(found) or 'none'}; entry point group {RECIPES_GROUP}): name the task's module, "
                          "recipe=MODULE (or reinstall this project: pip install -e .)")
    if not isinstance(recipe, str):
        raise ConfigError(f"config key recipe={recipe!r} is invalid: allowed the name of a Python module (e.g. "
                          "recipe=my_task.recipe)")
    if not isinstance(plugins, list) or not all(isinstance(p, str) and p for p in plugins):
        raise ConfigError(f"config key plugins={plugins!r} is invalid: allowed a list of Python module names (e.g. "
                          "plugins=[my_estimators])")
    return recipe, plugins


# ------------------------------------------------------------------ layers -> config
def _pairs(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """A YAML mapping as (dotted key, value) pairs: mappings are walked, anything else is a value."""
    if not isinstance(node, dict) or (prefix and not node):
        return [(prefix, node)]
    return [pair for key, value in node.items() for pair in _pairs(value, f"{prefix}.{key}" if prefix else str(key))]


def _yaml_pairs(path: str | Path) -> list[tuple[str, Any]]:
    return _pairs(OmegaConf.to_container(OmegaConf.load(path), resolve=False))


def parse_override(item: str) -> tuple[str, Any]:
    """``key=value`` -> (key, value parsed as OmegaConf's dotlist parses it: numbers, bools, null, lists)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value")
    key, raw = item.split("=", 1)
    return key.strip(), _hydra_mapping(OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]),
                                                               resolve=False)["v"])


def _hydra_mapping(value: Any) -> Any:
    """Hydra's ``{em:1.0, f1:0.5}`` (no space after the colon) as the mapping it means; YAML reads ``em:1.0`` as a
    key with no value."""
    if not isinstance(value, dict) or not any(isinstance(k, str) and ":" in k and v is None for k, v in value.items()):
        return value
    out = {}
    for k, v in value.items():
        if isinstance(k, str) and ":" in k and v is None:
            k, raw = k.split(":", 1)
            v = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw.strip()}"]), resolve=False)["v"]
        out[k.strip() if isinstance(k, str) else k] = v
    return out


def _shape_error(merged, items: list[tuple[str, Any]]) -> ConfigError:
    """The key of ``items`` whose value cannot merge into ``merged`` (a list where the schema has a mapping, or the
    other way round), as a ConfigError naming it and the shape expected."""
    for key, value in items:
        tree: dict = {}
        _put(tree, key, value)
        try:
            OmegaConf.merge(merged, OmegaConf.create(tree))
        except TypeError:
            expected = "a mapping, e.g. {a: 1.0, b: 0.5}" if isinstance(value, list) else "a list, e.g. [a, b]"
            return ConfigError(f"config key {key}={value!r} is invalid: allowed {expected}")
        except OmegaConfBaseException:
            continue
    return ConfigError(f"the values of {', '.join(key for key, _ in items)} do not fit the config's shape")


def _put(tree: dict, key: str, value: Any) -> None:
    """Set the dotted ``key`` in the nested dict ``tree`` (a later value of a key replaces an earlier one)."""
    *parents, last = key.split(".")
    for part in parents:
        node = tree.get(part)
        if not isinstance(node, dict):
            node = tree[part] = {}
        tree = node
    tree[last] = value


def _get(cfg: Config, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _set(cfg: Config, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    setattr(_get(cfg, ".".join(parents)) if parents else cfg, last, value)


def run_name(cfg: Config) -> str:
    """The default experiment name: ``<data>_<model>_<adv_estimator>``, e.g. ``nq_hotpotqa_Qwen2.5-3B_grpo``
    (data = the first training file's directory, or its stem when that says more). The same command gives
    the same name, so a rerun after a crash finds its checkpoints."""
    first = Path((cfg.data.train_files or "data").split(",")[0].strip())
    data = first.parent.name if first.stem in ("train", "training", "") and first.parent.name else first.stem
    model = Path((cfg.actor_rollout_ref.model.path or "model").rstrip("/")).name
    return re.sub(r"[^\w.+-]+", "-", f"{data}_{model}_{cfg.algorithm.adv_estimator}")


def load_config(overrides: list[str] | None = None, files: tuple[str | Path, ...] | list[str | Path] = ()) -> Config:
    """The recipe's YAML of defaults, then each YAML in ``files``, then the ``key=value`` overrides -> a validated
    config of the recipe's class (see the module docstring for the order in which modules are imported).

    Keys spelled as Search-R1 or verl spell them are translated first (``config_compat``); each foreign key
    that changes nothing here is logged once as a notice.
    """
    recipe, schema, base, items = None, Config, None, []
    try:
        given = [_yaml_pairs(f) for f in files]
        given.append([parse_override(item) for item in overrides or []])
        recipe, plugins = _chosen(given)
        import_plugins(plugins)
        schema, base = recipe_config(recipe)
        table = rules(schema)
        merged, global_counts, notices = OmegaConf.structured(schema), {}, []
        for pairs in ([_yaml_pairs(base)] if base else []) + given:  # each layer overrides the ones before it
            layer, tree = translate(pairs, table), {}
            items = layer.items
            for key, value in layer.items:
                _put(tree, key, value)
                global_counts.pop(key, None)
            try:
                merged = OmegaConf.merge(merged, OmegaConf.create(tree))
            except TypeError:  # "Cannot merge incompatible container types": a list given for a mapping, or back
                raise _shape_error(merged, layer.items) from None
            global_counts.update(layer.global_counts)
            notices += layer.notices
        cfg = OmegaConf.to_object(merged)
        if cfg.trainer.experiment_name is None:
            merged.trainer.experiment_name = run_name(cfg)
        if cfg.actor_rollout_ref.rollout.multi_turn.format is None:  # null: the recipe's (saved resolved)
            merged.actor_rollout_ref.rollout.multi_turn.format = default_format(recipe)
        OmegaConf.resolve(merged)
        cfg = OmegaConf.to_object(merged)
    except ConfigKeyError as err:  # OmegaConf names the first unknown part ('foo' of 'foo.bar')
        given = next((k for k, _ in items if k == err.full_key or k.startswith(f"{err.full_key}.")), err.full_key)
        keys = base.name if base else f"{schema.__module__}.{schema.__name__}"
        raise ConfigError(f"unknown config key {given!r}{did_you_mean(given, schema(), rules(schema))} "
                          f"(recipe={recipe} takes the keys of {keys}; docs/config.md lists them and the Search-R1 and "
                          "verl spellings accepted)") from err
    except OmegaConfBaseException as err:
        raise ConfigError(f"config key {err.full_key!r}: {err.msg.splitlines()[0]}") from err
    except CompatError as err:
        raise ConfigError(str(err)) from err
    world = world_size(cfg)
    for key, (theirs, count) in global_counts.items():
        _set(cfg, key, max(1, count // world))
        notices.append(f"{theirs}={count} is a global count (Search-R1, older verl): "
                       f"{key.rsplit('.', 1)[1]}={_get(cfg, key)} on each of {world} rank(s)")
    for notice in dict.fromkeys(notices):
        logger.warning("config: %s", notice)
    return validate(cfg)


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (saved next to checkpoints and logged at start)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
