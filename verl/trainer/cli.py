"""The command line shared by the trainers' entry points (``main_ppo``, ``main_sft``): ``--config FILE`` layers and
``key=value`` overrides. Light on purpose (no torch): ``--help`` and a bad argument answer at once."""

from __future__ import annotations

import os

from verl.errors import ConfigError


class HelpRequested(Exception):
    """-h / --help on the command line."""


def split_args(argv: list[str], base: str = "configs/ppo_trainer.yaml") -> tuple[list[str], list[str]]:
    """``--config FILE`` (repeatable, also ``--config=FILE``) and ``key=value`` overrides, in their order (``base``:
    the YAML of defaults the files are layered over, as the error for a missing file names it)."""
    files, overrides, rest = [], [], list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--config":
            if not rest:
                raise ConfigError("--config needs a YAML file")
            files.append(rest.pop(0))
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
        elif arg in ("-h", "--help"):
            raise HelpRequested
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option {arg!r}: the trainer takes --config FILE and key=value overrides")
        else:
            overrides.append(arg)
    for f in files:
        if not os.path.isfile(f):
            raise ConfigError(f"--config {f!r}: no such file (a YAML of keys to layer over {base})")
    return files, overrides
