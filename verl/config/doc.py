"""``python -m verl.config.doc`` (``make docs``): the recipe's YAML of defaults and docs/config.md, both generated
from the config's declarations (``verl.config.schema``).

For the default recipe (``recipe``'s default, the search recipe) this writes its ``BASE_CONFIG``
(``configs/ppo_trainer.yaml``: every key with its default and its doc as the comment above it, grouped by section
as the config class declares them, the class docstring as the header) and ``docs/config.md`` (every key with its
default, what it allows and its doc; the keys ``configs/demo.yaml`` and ``configs/grpo.yaml`` change; the other
spellings accepted); and the SFT trainer's ``configs/sft_trainer.yaml`` and ``docs/config_sft.md``
(``verl.config.sft``). Allowed values kept in a registry (estimators, losses, scorers) are read from it now, so a
doc's ``{choices}`` lists what is registered. ``--check`` writes nothing and exits 1 naming the stale files;
``tests/verl/test_config_doc.py`` runs it, so no generated file can drift from the code.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from verl.config.compat import Alias, GlobalCount, NoEffect, mapping, rules
from verl.config.load import CONFIG_DIR, recipe_config
from verl.config.rl import Config
from verl.config.schema import Setting, allowed, entries, leaves
from verl.config.sft import SFT_CONFIG, SFTConfig

ROOT = CONFIG_DIR.parent
WIDTH = 120
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<value>.*)$")


def documented_keys(yaml_path: Path) -> list[tuple[str, str, str]]:
    """(dotted key, value as written, comment above it) for every leaf key of a commented YAML file."""
    rows, stack, comment = [], [], []  # stack: (indent, key) of the enclosing mappings
    for line in yaml_path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if not match:
            comment = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        value = match["value"].split(" #")[0].strip()
        dotted = ".".join([k for _, k in stack] + [match["key"]])
        if value:
            rows.append((dotted, value, " ".join(comment)))
        else:
            stack.append((indent, match["key"]))
        comment = []
    return rows


def yaml_value(value: Any) -> str:
    """``value`` as the YAML of a flat file writes it: ``null``, ``true``, ``1.0e-6``, ``[a, b]``, unquoted strings
    unless YAML would read them as something else."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        if "e" in text:
            mantissa, exponent = text.split("e")
            text = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exponent)}"
        return text
    if isinstance(value, list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    return text if yaml.safe_load(f"k: {text}")["k"] == value else json.dumps(value)


def doc_text(s: Setting) -> str:
    """The setting's doc with ``{choices}`` replaced by the names allowed now (``a | b | c``)."""
    return s.doc.replace("{choices}", " | ".join(s.allowed_choices()))


def _comment(text: str, indent: str) -> list[str]:
    width = WIDTH - len(indent) - 2
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)]


def _yaml_lines(node: Any, depth: int = 0) -> list[str]:
    indent, lines, previous = "  " * depth, [], None
    for entry in entries(node):
        if depth == 0 and previous is not None and (entry.is_section or previous.is_section):
            lines.append("")
        if entry.is_section:
            lines += _comment(entry.section_doc or "", indent) + [f"{indent}{entry.name}:"]
            lines += _yaml_lines(entry.value, depth + 1)
        else:
            lines += _comment(doc_text(entry.setting) if entry.setting else "", indent)
            lines.append(f"{indent}{entry.name}: {yaml_value(entry.value)}")
        previous = entry
    return lines


def render_yaml(schema: type[Config]) -> str:
    """The documented YAML of ``schema``'s defaults: its docstring as the header, then every key."""
    header = [f"# {line}".rstrip() for line in (inspect.getdoc(schema) or "").splitlines()]
    return "\n".join([*header, "", *_yaml_lines(schema())]) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _spelling_rows(schema: type) -> list[str]:
    out = []
    for key, rule in rules(schema).items():
        if isinstance(rule, Alias):
            here = f"the same as `{rule.to}`" + (f" ({rule.note})" if rule.note else "")
            if rule.values is not None:
                here += ": " + mapping(rule.values, rule.to)
        elif isinstance(rule, GlobalCount):
            here = f"a global count: `{rule.to}` = this / number of ranks"
        else:
            assert isinstance(rule, NoEffect)
            values = "" if rule.allowed is None else " Allowed: " + ", ".join(
                "null" if v is None else f"`{v}`" for v in rule.allowed) + "; other values are errors."
            here = f"no effect: {rule.why}.{values}"
        out.append(f"| `{key}` | {_cell(here)} |")
    return out


def render_md(schema: type[Config], base: Path | None) -> str:
    """docs/config.md for the recipe whose config class is ``schema`` and whose YAML of defaults is ``base``."""
    where = f"`configs/{base.name}`" if base else f"`{schema.__module__}.{schema.__name__}`"
    out = ["# Configuration reference",
           "",
           "Generated by `python -m verl.config.doc` (`make docs`) from the declarations of the config of the default "
           f"recipe `{Config.recipe}` (`verl/config/sections.py`, `verl/config/shared.py`, `verl/config/algorithm.py`, "
           f"`verl/config/rl.py`, `{Config.recipe.split('.')[0]}/config.py`: every key, "
           f"its default, what it allows and its doc, also the comments of {where}), the layers `configs/demo.yaml` "
           "and `configs/grpo.yaml`, and the other spellings accepted (declared on the settings; the keys with no "
           "effect are `verl/config/compat.py`'s table). Do not edit by hand; a test checks it is current.",
           "",
           "Set a key on the command line as `key.sub=value` (OmegaConf dotlist); layer a YAML of keys with "
           f"`--config FILE`. Order: {where}, then each `--config` file, then the overrides. Unknown keys and bad "
           "values stop the run (exit 2) naming the key and what is allowed. `recipe` names the task's module, "
           "which declares the keys beyond the trainer's (another recipe has other keys); `plugins` names modules "
           "imported before the config is checked, whose registered estimators, losses and reward terms are then "
           "allowed values.",
           "",
           f"## Keys and defaults ({where})",
           "",
           *_key_rows(schema)]
    for name, what in (("demo.yaml", "the embedded demo (`make demo`, `bash train_ppo.sh` with nothing pointing "
                                     "elsewhere)"),
                       ("grpo.yaml", "GRPO (`bash train_grpo.sh`)")):
        out += ["", f"## `configs/{name}`: {what}", "", "| key | value |", "|---|---|"]
        out += [f"| `{key}` | `{_cell(value)}` |" for key, value, _ in documented_keys(CONFIG_DIR / name)]
    out += ["", "## Other spellings accepted (Search-R1, verl)", "",
            "Search-R1's `train_ppo.sh` / `train_grpo.sh` and verl's documented keys run as written. `+key=value` and "
            "`++key=value` (Hydra) name the same key. Two spellings of one setting with different values on one "
            "command line are an error. A key with no effect covers its sub-keys. Units: `ppo_mini_batch_size` counts "
            "trajectories (prompts x `rollout.n`), as Search-R1 counts "
            "it with `rollout.n_agent`; today's verl counts prompts.", "",
            "| key | here |", "|---|---|", *_spelling_rows(schema)]
    return "\n".join(out) + "\n"


def render_sft_md() -> str:
    """docs/config_sft.md: every key of the SFT trainer (``verl.config.sft``) with its default, what it allows and
    its doc, and the other spellings accepted."""
    out = ["# SFT configuration reference",
           "",
           "Generated by `python -m verl.config.doc` (`make docs`) from the declarations of `verl/config/sft.py` and "
           "`verl/config/shared.py` (the sections the RL trainer holds too: `optim`, `trainer`; also the comments of "
           "`configs/sft_trainer.yaml`). Do not edit by hand; a test checks it is current. "
           "`python -m verl.trainer.main_sft` (`search-r1-sft`) takes `--config FILE` and `key=value` overrides "
           "layered over `configs/sft_trainer.yaml`; unknown keys and bad values stop the run (exit 2) naming the key.",
           "",
           *_key_rows(SFTConfig),
           "",
           "## Other spellings accepted (verl's SFT trainer, older verl)",
           "",
           "The shared sections name their keys as the RL trainer does; verl's SFT trainer's names for them run as "
           "written, and a run directory saved under them continues. Two spellings of one setting with different "
           "values on one command line are an error.",
           "",
           "| key | here |", "|---|---|", *_spelling_rows(SFTConfig)]
    return "\n".join(out) + "\n"


def _key_rows(schema: type) -> list[str]:
    """The table of every key of ``schema``: default, what it allows, its doc."""
    out = ["| key | default | allowed | what it does |", "|---|---|---|---|"]
    for leaf in leaves(schema()):
        s = leaf.setting or Setting("")
        out.append(f"| `{leaf.key}` | `{_cell(yaml_value(leaf.value))}` | {_cell(allowed(s, leaf.hint))} | "
                   f"{_cell(doc_text(s))} |")
    return out


def generated() -> dict[Path, str]:
    """Each generated file of the default recipe and of the SFT trainer -> its text as the declarations say it
    now."""
    schema, base = recipe_config(Config.recipe)
    out = {ROOT / "docs" / "config.md": render_md(schema, base)}
    if base is not None:
        out[base] = render_yaml(schema)
    out[SFT_CONFIG] = render_yaml(SFTConfig)
    out[ROOT / "docs" / "config_sft.md"] = render_sft_md()
    return out


def main(argv: list[str]) -> int:
    stale = []
    for path, text in generated().items():
        if "--check" in argv:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; regenerate with `make docs` (python -m verl.config.doc)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
