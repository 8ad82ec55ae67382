"""One declaration per setting: a config field's metadata says everything the project says about it.

A config is a tree of dataclasses (``verl.config.Config`` and a recipe's subclass of it). Each leaf field is
declared with ``setting(default, doc, ...)`` and each nested section with ``section(cls, doc)``; from these
declarations alone come

* the checks: ``check_settings`` is one walk of the typed config that refuses non-finite numbers (anywhere, the
  values of mappings and lists included), values outside a setting's ``choices`` (each element of a list) and
  numbers outside its range. Errors name the key and say what is allowed (``allowed``). Rules that relate several
  keys are not declarations: they are the ``check`` method of the config class (a subclass calls ``super()``);
* the documented YAML and docs/config.md (``verl.config.doc``: default, doc, allowed values);
* the other spellings a key is accepted under (``verl.config.compat.rules`` reads ``spellings``);
* the keys that only steer a run (``steering_keys``: a rerun may change them and continue the run, ``run_dir``).

Choices:
- ``choices`` is a tuple, or a function returning the names at the time of the check, for choices kept in a
  registry (estimators, losses, scorers): a name registered by a recipe or plug-in module imported before the
  config is checked is then as valid as the built-ins, and nothing lists the names a second time. A doc may
  say ``{choices}`` where the names belong; the generated YAML and docs/config.md fill them in.
- Whether ``null`` is allowed is the field's annotation (``X | None``), as OmegaConf enforces it;
  ``null_means`` only says what null does. ``off`` is one value outside the range that switches the setting
  off (``top_k=-1``). Whether a number is an integer is also the annotation's.
- A field declared without ``setting`` is checked for finiteness only (and has no documentation).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import NoneType, UnionType
from typing import Any

from verl.errors import ConfigError

_SETTING, _SECTION = "verl.setting", "verl.section"


@dataclass(frozen=True)
class Setting:
    """What is declared about one leaf key (see ``setting``)."""

    doc: str
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # True: ``low`` itself is not allowed
    high_open: bool = False
    null_means: str = ""
    off: int | None = None
    what: str = ""
    spellings: tuple = ()  # verl.config.compat.Alias / GlobalCount
    steers: bool = False

    def allowed_choices(self) -> tuple[str, ...]:
        """The choices as of now (a registry's names are read at each call)."""
        return tuple(self.choices() if callable(self.choices) else self.choices or ())


def setting(default: Any, doc: str, *, choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None,
            low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False,
            null_means: str = "", off: int | None = None, what: str = "", spellings: tuple = (),
            steers: bool = False) -> Any:
    """A dataclass field for one setting: its default, its doc (the YAML comment above the key), the values it
    allows (``choices``, or a range ``low``..``high`` whose bounds are included unless ``low_open``/``high_open``;
    ``what`` names the quantity in the error), what null means where the annotation allows null, an ``off``
    value outside the range, other spellings of the key (``verl.config.compat``) and whether it only steers a
    run (``steers``: a rerun may change it and still continue the run)."""
    meta = {_SETTING: Setting(doc, choices, low, high, low_open, high_open, null_means, off, what, tuple(spellings),
                              steers)}
    if isinstance(default, list | dict):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, doc: str = "", **defaults: Any) -> Any:
    """A dataclass field holding the section ``cls`` (a dataclass of settings), documented by ``doc`` (the comment
    above the section's key); ``defaults`` replace the section's own defaults in this place (the critic's
    learning rate)."""
    return field(default_factory=functools.partial(cls, **defaults), metadata={_SECTION: doc})


@dataclass(frozen=True)
class Entry:
    """One field of a config node: a setting (a leaf) or a section (``value`` is a dataclass)."""

    name: str
    value: Any
    hint: Any  # the resolved annotation
    setting: Setting | None  # None for a section, or a field declared without ``setting``
    section_doc: str | None  # None for a leaf

    @property
    def is_section(self) -> bool:
        return dataclasses.is_dataclass(self.value)


@dataclass(frozen=True)
class Leaf:
    """A setting of a config tree by its dotted key."""

    key: str
    value: Any
    hint: Any
    setting: Setting | None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def entries(node: Any) -> list[Entry]:
    """The fields of the config node ``node`` (a dataclass instance), in declaration order."""
    hints = _hints(type(node))
    return [Entry(f.name, getattr(node, f.name), hints[f.name], f.metadata.get(_SETTING),
                  f.metadata.get(_SECTION) if dataclasses.is_dataclass(getattr(node, f.name)) else None)
            for f in dataclasses.fields(node)]


def leaves(node: Any, prefix: str = "") -> Iterator[Leaf]:
    """Every setting of the config tree ``node`` (a dataclass instance) with its dotted key, depth first."""
    for entry in entries(node):
        key = f"{prefix}{entry.name}"
        if entry.is_section:
            yield from leaves(entry.value, key + ".")
        else:
            yield Leaf(key, entry.value, entry.hint, entry.setting)


def declared(cls: type, name: str) -> Setting:
    """The declaration of the field ``name`` of the config class ``cls``."""
    return next(f.metadata[_SETTING] for f in dataclasses.fields(cls) if f.name == name)


def did_you_mean(given: str, cfg: Any, also: Iterable[str] = ()) -> str:
    """``; did you mean A or B?`` naming the keys of the config tree ``cfg`` (and the other spellings ``also``)
    nearest to the unknown key ``given``: by difflib's ratio, at least 0.6, at most 3 and none more than 0.05 below
    the best; "" when none is near. What the error for a misspelt key adds."""
    given = given.lstrip("+")
    keys = sorted({leaf.key for leaf in leaves(cfg)} | set(also))
    ratios = {key: difflib.SequenceMatcher(None, given, key).ratio()
              for key in difflib.get_close_matches(given, keys, n=3, cutoff=0.6)}
    near = [key for key, ratio in ratios.items() if ratio >= max(ratios.values()) - 0.05]
    return f"; did you mean {' or '.join(near)}?" if near else ""


def steering_keys(cfg: Any) -> frozenset[str]:
    """The keys declared ``steers``: a rerun may change them and still continue the run (``verl.utils.run_dir``)."""
    return frozenset(leaf.key for leaf in leaves(cfg) if leaf.setting is not None and leaf.setting.steers)


def _optional(hint: Any) -> bool:
    return isinstance(hint, UnionType) and NoneType in typing.get_args(hint)


def _integer(hint: Any) -> bool:
    args = typing.get_args(hint) if isinstance(hint, UnionType) else (hint,)
    return int in args and float not in args


def _range_text(s: Setting, integer: bool, plural: bool = False) -> str:
    kind = ("integers" if integer else "numbers") if plural else "an integer" if integer else "a number"
    if s.low is not None and s.high is not None:
        text = f"{kind} in {'(' if s.low_open else '['}{s.low:g}, {s.high:g}{')' if s.high_open else ']'}"
    elif s.low is not None:
        text = f"{kind} {'>' if s.low_open else '>='} {s.low:g}"
    else:
        text = f"{kind} {'<' if s.high_open else '<='} {s.high:g}"
    return f"{s.what}, {text}" if s.what else text


def allowed(s: Setting, hint: Any) -> str:
    """What the setting allows, in words: ``null (= clip_ratio) or a number in (0, 1)``, ``one of sync, async``,
    ``a list of console, jsonl``, ``a list of numbers in [0, 1)``, ``a mapping of em, f1, ... to a number >= 0``; ""
    when only its type is checked."""
    if s.choices is None and s.low is None and s.high is None:
        return ""
    parts = []
    if _optional(hint):
        parts.append(f"null ({s.null_means})" if s.null_means else "null")
    if s.off is not None:
        parts.append(f"{s.off} (off)")
    names = ", ".join(s.allowed_choices()) if s.choices is not None else None
    number = _range_text(s, _integer(hint)) if s.low is not None or s.high is not None else None
    inner = next((a for a in typing.get_args(hint) if a is not NoneType), None) if _optional(hint) else hint
    container = typing.get_origin(inner)
    if container is dict:
        parts.append(f"a mapping of {names or 'names'} to {number or 'values'}")
    elif container is list:
        item_is_int = typing.get_args(inner) == (int,)
        parts.append(f"a list of {names or _range_text(s, item_is_int, plural=True)}")
    else:
        parts += [f"one of {names}"] if names else []
        parts += [number] if number else []
    return " or ".join(parts)


def _in_range(value: float, s: Setting) -> bool:
    above = s.low is None or (value > s.low if s.low_open else value >= s.low)
    below = s.high is None or (value < s.high if s.high_open else value <= s.high)
    return above and below


def _floats(value: Any, key: str) -> Iterator[tuple[str, float]]:
    """(key, number) of every float in ``value``, the values of mappings and the items of lists included."""
    if isinstance(value, float):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _floats(v, f"{key}.{k}")
    elif isinstance(value, list):
        for v in value:
            yield from _floats(v, key)


def invalid(key: str, value: object, allowed: str, ours: str = "") -> ConfigError:
    """``config key KEY=VALUE is invalid: allowed ALLOWED``: the one wording of a refused value, for the declarations'
    walk and the rules between keys alike. ``ours``: our name of the key when ``key`` is another spelling of it
    (said after the value: ``config key optim.lr_scheduler='linear' (optim.warmup_style here) is invalid``)."""
    here = f" ({ours} here)" if ours else ""
    return ConfigError(f"config key {key}={value!r}{here} is invalid: allowed {allowed}")


def require(ok: bool, key: str, value: object, allowed: str) -> None:
    """``invalid(key, value, allowed)`` raised unless ``ok``."""
    if not ok:
        raise invalid(key, value, allowed)


def _parts(key: str, value: Any) -> list[tuple[str, Any, Any]]:
    """(key, name checked against the choices, number checked against the range) of each part of a value: the
    value itself, each item of a list, each ``key: value`` of a mapping (``reward.terms.em``, ``em``, its weight)."""
    if isinstance(value, list):
        return [(key, item, item) for item in value]
    if isinstance(value, dict):
        return [(f"{key}.{k}", k, v) for k, v in value.items()]
    return [(key, value, value)]


def _refused(key: str, leaf_key: str, given_as: Mapping[str, str], value: object, what: str) -> ConfigError:
    """``invalid`` for ``key`` (a leaf's key or a part of it, ``reward.terms.em``), named as the user spelled its
    leaf when that was another spelling (``given_as``), with ours after the value."""
    theirs = given_as.get(leaf_key)
    if theirs is None:
        return invalid(key, value, what)
    return invalid(theirs + key[len(leaf_key):], value, what, ours=key)


def check_settings(cfg: Any, given_as: Mapping[str, str] | None = None) -> None:
    """Every setting of ``cfg`` against its declaration: finite, among its choices (each item of a list, each key
    of a mapping), within its range (each number of a list or mapping); ConfigError naming the first key that is
    not, as the user spelled it (``given_as``: our key -> the other spelling it was set under,
    ``verl.config.compat.Translated.given_as``)."""
    given_as = given_as or {}
    for leaf in leaves(cfg):
        for key, number in _floats(leaf.value, leaf.key):
            if not math.isfinite(number):
                raise _refused(key, leaf.key, given_as, number, "a finite number (not nan or inf)")
        s = leaf.setting
        if s is None or leaf.value is None:
            continue
        names = s.allowed_choices() if s.choices is not None else None
        bounded = s.low is not None or s.high is not None
        for key, name, number in _parts(leaf.key, leaf.value):
            numeric = isinstance(number, int | float) and not isinstance(number, bool)
            if (names is not None and name not in names) or \
                    (bounded and numeric and number != s.off and not _in_range(number, s)):
                raise _refused(key, leaf.key, given_as, number, allowed(s, leaf.hint))
