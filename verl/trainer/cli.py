"""The command line shared by the trainers' entry points (``main_ppo``, ``main_sft``): ``--config FILE`` layers and
``key=value`` overrides, ``--help``, and how errors become a message and an exit status (``run``). Light on purpose
(no torch until the arguments are read): ``--help`` and a bad argument answer at once.

Exit statuses (docs/design.md, "Exit statuses"): 0 done (or help shown), 2 unusable input (a bad key or value, a
missing or malformed file, an unusable checkpoint or run directory: the message names it), 3 the run stopped on
purpose (the errors the entry point names as ``stopped``). Each error is one line ``error: <message>`` on stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from verl.errors import CheckpointError, ConfigError, DataError, RunDirError
from verl.utils.logs import setup_logging

EXIT_INPUT = 2  # unusable input: the message names the key, file or row
EXIT_STOPPED = 3  # the run stopped on purpose (too many skipped updates, an environment that stayed down)


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


def failed(err: BaseException, status: int) -> int:
    """Print ``error: <err>`` on stderr; returns ``status`` (the entry point's exit status)."""
    print(f"error: {err}", file=sys.stderr)
    return status


def run(argv: list[str] | None, train: Callable[[list[str], list[str]], int], help_text: Callable[[list[str]], str],
        base: str = "configs/ppo_trainer.yaml", stopped: tuple[type[BaseException], ...] = ()) -> int:
    """An entry point's ``main``: read the command line (``argv``, default ``sys.argv[1:]``), print the help for
    ``-h``/``--help``, else call ``train(files, overrides)`` and return its exit status. Unusable input (a bad
    argument, or a ``ConfigError``, ``DataError``, ``RunDirError`` or ``CheckpointError`` from ``train``) is
    ``EXIT_INPUT``, an error of ``stopped`` is ``EXIT_STOPPED``; either prints one line naming it."""
    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    try:
        files, overrides = split_args(argv, base=base)
    except HelpRequested:
        print(help_text(argv))
        return 0
    except ConfigError as err:
        return failed(err, EXIT_INPUT)
    try:
        return train(files, overrides)
    except (ConfigError, DataError, RunDirError, CheckpointError) as err:
        return failed(err, EXIT_INPUT)
    except stopped as err:
        return failed(err, EXIT_STOPPED)


def already_complete(step: int, total_steps: int, out_dir: os.PathLike) -> str:
    """What a rerun of a finished run prints (it trains nothing and exits 0)."""
    return (f"run already complete: {step} of {total_steps} steps in {out_dir}; nothing to train (raise "
            "trainer.total_training_steps to continue it, or name another trainer.experiment_name)")
