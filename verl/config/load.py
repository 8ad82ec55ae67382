"""Layers of YAML and ``key=value`` -> a checked config: the recipe's YAML of defaults + ``--config`` files +
``key=value`` -> a ``Config`` (``load_config``); the SFT trainer's config is merged and checked by the same
functions (``merge_layers``, ``validate``; ``verl.config.sft``).

Choices:
- **The trainer knows no task.** ``Config`` (``verl.config.rl``) holds the trainer's sections and two keys that
  choose code: ``recipe`` (a module name: the task) and ``plugins`` (modules imported first). The recipe module
  declares its config class (``CONFIG_CLASS``, a subclass of ``Config`` adding the task's sections; default
  ``Config``) and its YAML of defaults (``BASE_CONFIG``; default none: the dataclass defaults); for example the
  search recipe's are ``search_r1.config.SearchConfig`` and ``configs/ppo_trainer.yaml``. ``recipe``
  defaults to the one recipe the installed packages register (``installed_recipe``), so the trainer names no task.
- **Code before keys.** ``load_config`` first reads ``recipe`` and ``plugins`` from the files and overrides, imports
  each plug-in and then the recipe module, and only then merges and checks the config against the recipe's class:
  whatever those modules register (an advantage estimator, a policy loss, a reward term) is then a valid value.
- **One declaration per setting** (``verl.config.schema``): default, doc, allowed values and other spellings are
  the field's; ``validate`` is one walk of those declarations (``check_settings``) and then the config class's
  ``check`` (rules between keys; a subclass calls ``super().check()``).
- OmegaConf merges the layers in struct mode, so an unknown key fails naming the key; types are checked by
  OmegaConf. Other trainers' spellings are translated first (``verl.config.compat``), and a value refused under
  another spelling is named as the user spelled it. Library code receives the typed objects and never falls back
  to defaults of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.resources
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from verl.config.compat import CompatError, rules, translate
from verl.config.rl import RECIPES_GROUP, Config, registered_recipes, world_size
from verl.config.schema import check_settings, did_you_mean
from verl.errors import ConfigError
from verl.tools import default_format

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _config_dir() -> Path:
    """``configs/`` of a checkout (editable installs included), else the copy an installed wheel ships as the
    package data ``verl.configs`` (setup.py maps it there)."""
    checkout = Path(__file__).resolve().parents[2] / "configs"
    if (checkout / "ppo_trainer.yaml").is_file():
        return checkout
    return Path(str(importlib.resources.files("verl.configs")))


CONFIG_DIR = _config_dir()
DEFAULT_CONFIG = CONFIG_DIR / "ppo_trainer.yaml"  # the search recipe's defaults (its BASE_CONFIG), generated
DEMO_CONFIG = CONFIG_DIR / "demo.yaml"  # the embedded demo's paths and small values, layered over the defaults


def validate(cfg: T, given_as: dict[str, str] | None = None) -> T:
    """Every setting against its declaration, then the rules between keys (the config class's ``check``);
    ConfigError naming the key (as the user spelled it: ``given_as``, see ``check_settings``)."""
    check_settings(cfg, given_as)
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


def yaml_pairs(path: str | Path) -> list[tuple[str, Any]]:
    """A YAML file of keys as (dotted key, value) pairs, in the file's order."""
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


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """Turn what OmegaConf and the spelling rules raise while layers are read and merged into a ConfigError naming
    the key (a ConfigError raised inside passes as it is)."""
    try:
        yield
    except OmegaConfBaseException as err:
        raise ConfigError(f"config key {err.full_key!r}: {err.msg.splitlines()[0]}") from err
    except CompatError as err:
        raise ConfigError(str(err)) from err


@dataclass
class Layered(Generic[T]):
    """A config merged from its layers (``merge_layers``), before its checks."""

    cfg: T
    global_counts: dict[str, tuple[str, int]] = field(default_factory=dict)  # our key -> (their key, global count)
    notices: list[str] = field(default_factory=list)  # one line per foreign key that was used (compat)
    given_as: dict[str, str] = field(default_factory=dict)  # our key -> the other spelling that set it last


def merge_layers(schema: type[T], layers: list[list[tuple[str, Any]]], default_name: Callable[[T], str],
                 takes: str) -> Layered[T]:
    """``schema``'s defaults, then each layer ((key, value) pairs as given, in order; a later layer wins), each
    first translated to our spellings (``compat.translate`` by ``compat.rules(schema)``); ``trainer.experiment_name``
    null becomes ``default_name(cfg)``; interpolations resolved. ConfigError naming an unknown key (``takes``: which
    keys the config takes, said after it) or a value of the wrong shape; the caller runs this in ``config_errors``."""
    table = rules(schema)
    merged, out, items = OmegaConf.structured(schema), Layered(None), []
    try:
        for pairs in layers:
            layer, tree = translate(pairs, table), {}
            items = layer.items
            for key, value in layer.items:
                _put(tree, key, value)
                out.global_counts.pop(key, None)
                out.given_as.pop(key, None)
            try:
                merged = OmegaConf.merge(merged, OmegaConf.create(tree))
            except TypeError:  # "Cannot merge incompatible container types": a list given for a mapping, or back
                raise _shape_error(merged, layer.items) from None
            out.global_counts.update(layer.global_counts)
            out.given_as.update(layer.given_as)
            out.notices += layer.notices
        if merged.trainer.experiment_name is None:
            merged.trainer.experiment_name = default_name(OmegaConf.to_object(merged))
        OmegaConf.resolve(merged)
        out.cfg = OmegaConf.to_object(merged)
    except ConfigKeyError as err:  # OmegaConf names the first unknown part ('trainr' of 'trainr.seed')
        given = next((k for k, _ in items if k == err.full_key or k.startswith(f"{err.full_key}.")), err.full_key)
        raise ConfigError(f"unknown config key {given!r}{did_you_mean(given, schema(), table)} ({takes})") from err
    return out


def log_notices(notices: list[str]) -> None:
    """Each notice once, as a warning (a foreign key used: what it means here)."""
    for notice in dict.fromkeys(notices):
        logger.warning("config: %s", notice)


def experiment_name(train_files: str | None, model_path: str | None, what: str) -> str:
    """The default experiment name: ``<data>_<model>_<what>``, e.g. ``nq_hotpotqa_Qwen2.5-3B_grpo`` (data = the first
    training file's directory, or its stem when that says more). The same command gives the same name, so a rerun
    after a crash finds its checkpoints."""
    first = Path((train_files or "data").split(",")[0].strip())
    data = first.parent.name if first.stem in ("train", "training", "") and first.parent.name else first.stem
    model = Path((model_path or "model").rstrip("/")).name
    return re.sub(r"[^\w.+-]+", "-", f"{data}_{model}_{what}")


def run_name(cfg: Config) -> str:
    """The RL trainer's default experiment name, ``<data>_<model>_<adv_estimator>`` (``experiment_name``)."""
    return experiment_name(cfg.data.train_files, cfg.actor_rollout_ref.model.path, cfg.algorithm.adv_estimator)


def _get(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _set(cfg: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    setattr(_get(cfg, ".".join(parents)) if parents else cfg, last, value)


def load_config(overrides: list[str] | None = None, files: tuple[str | Path, ...] | list[str | Path] = ()) -> Config:
    """The recipe's YAML of defaults, then each YAML in ``files``, then the ``key=value`` overrides -> a validated
    config of the recipe's class (see the module docstring for the order in which modules are imported).

    Keys spelled as Search-R1 or verl spell them are translated first (``verl.config.compat``); each foreign key
    that changes nothing here is logged once as a notice.
    """
    with config_errors():
        given = [yaml_pairs(f) for f in files]
        given.append([parse_override(item) for item in overrides or []])
        recipe, plugins = _chosen(given)
        import_plugins(plugins)
        schema, base = recipe_config(recipe)
        keys = base.name if base else f"{schema.__module__}.{schema.__name__}"
        layered = merge_layers(schema, ([yaml_pairs(base)] if base else []) + given, run_name,
                               f"recipe={recipe} takes the keys of {keys}; docs/config.md lists them and the "
                               "Search-R1 and verl spellings accepted")
    cfg, notices = layered.cfg, list(layered.notices)
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if multi_turn.format is None:  # null: the recipe's (the run directory's config.yaml records it resolved)
        multi_turn.format = default_format(recipe)
    world = world_size(cfg)
    for key, (theirs, count) in layered.global_counts.items():
        _set(cfg, key, max(1, count // world))
        notices.append(f"{theirs}={count} is a global count (Search-R1, older verl): "
                       f"{key.rsplit('.', 1)[1]}={_get(cfg, key)} on each of {world} rank(s)")
    log_notices(notices)
    return validate(cfg, layered.given_as)


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (saved next to checkpoints and logged at start)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
