"""Entry point: ``python -m verl.trainer.main_ppo [--config FILE ...] key=value ...``.

Builds the typed config (the recipe's YAML of defaults, then each ``--config`` YAML, then the overrides;
validated once, after the plug-in and recipe modules are imported: ``verl.config``), loads the recipe the config
names (``recipe``: generation loop, reward, metrics and keys of the task; the search agent by default), builds the
trainer, prints a short start-up summary (the full config is in the run directory's ``config.yaml``) and calls
``PPOTrainer.fit()``. Exit status: 0 done, 2 a config error (bad key or value, a missing file, an unusable
checkpoint or run directory), 3 the run stopped on purpose (``TrainingStopped``: too many skipped updates, or the
environment stayed down).

The console shows the summary, one line per step (and a progress bar on a terminal) and warnings; library
INFO chatter stays at debug level (``LOGLEVEL=INFO`` or ``DEBUG`` shows more).

Light at import: the config is loaded and checked (a misspelt key refused, with the nearest keys named) before
torch, transformers or the trainer are imported; ``build_trainer`` imports them.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from verl.config import (
    Config,
    ConfigError,
    check_paths,
    load_config,
    recipe_module,
    trajectories_per_step,
    world_size,
)
from verl.errors import EnvironmentUnavailable, TrainingStopped
from verl.trainer import cli
from verl.utils.tracking import check_loggers

if TYPE_CHECKING:
    from verl.trainer.ppo_trainer import PPOTrainer

logger = logging.getLogger("verl.trainer.main_ppo")


HELP = """usage: python -m verl.trainer.main_ppo [--config FILE ...] key=value ...

Train a policy with PPO/GRPO on the task the config key `recipe` names (a Python module; default: the one the
installed packages register, {default}). Every key of the recipe's config can be set as key=value (OmegaConf
dotlist; Search-R1's and verl's spellings are accepted, docs/config.md lists them all). Each --config FILE is a
YAML of keys layered over the recipe's defaults, in order; key=value overrides come last.

  actor_rollout_ref.model.path       the policy, a Hugging Face model directory
  recipe=MODULE                      the task: its generation loop, reward and keys
  plugins=[MODULE, ...]              modules imported first: the estimators, policy losses and reward terms they
                                     register are valid values

{recipe}

Exit status: 0 done, 2 unusable input (the message names the key), 3 stopped on purpose (see docs/design.md)."""


def help_text(argv: list[str]) -> str:
    """``HELP`` with the help of the recipe that ``recipe=MODULE`` on the command line names (else the default)."""
    name = next((a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("recipe=")), Config.recipe)
    try:
        recipe_help = getattr(recipe_module(name), "HELP", f"(recipe {name} has no help)")
    except ConfigError as err:
        recipe_help = f"(recipe {name}: {err})"
    return HELP.format(recipe=recipe_help, default=Config.recipe or "none")


def build_trainer(cfg: Config) -> PPOTrainer:
    """The trainer for ``cfg`` with the recipe it names (raises ConfigError for an unknown recipe)."""
    import torch

    from verl.trainer.ppo_trainer import PPOTrainer
    from verl.trainer.recipe import load_recipe

    torch.manual_seed(cfg.trainer.seed)
    return PPOTrainer(cfg, load_recipe(cfg.recipe))


def startup_summary(cfg: Config, trainer: PPOTrainer) -> str:
    """What the run is, in a few lines: run directory, model, engine and ranks, data, updates per step, then what the
    recipe says of itself (its ``describe(cfg)``, e.g. the search recipe's retrieval service and turns)."""
    from verl.utils import checkpoint
    from verl.workers.train_utils import optimizer_steps_per_training_step

    r, a, t = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor, cfg.trainer
    trajectories = trajectories_per_step(cfg)
    updates = optimizer_steps_per_training_step(trajectories, a.ppo_mini_batch_size, a.ppo_epochs)
    latest = checkpoint.find_latest(trainer.out_dir) if t.resume_mode == "auto" else None
    lines = [
        (f"run      validation only -> {trainer.out_dir}" if t.val_only else
         f"run      {cfg.algorithm.adv_estimator}, {trainer.total_steps} steps -> {trainer.out_dir}")
        + (f" (continuing {latest.name})" if latest else ""),
        f"model    {cfg.actor_rollout_ref.model.path} ({r.name} engine in {r.dtype}, training in "
        f"{a.fsdp_config.dtype}, {world_size(cfg)} rank(s)"
        + (f" + {t.rollout_ranks} rollout rank(s)" if t.rollout_ranks else "") + f", {t.backend} backend)",
        f"rollout  {r.mode}" + (f", pipelined: up to {t.max_staleness} version(s) stale"
                                + (", partial" if r.partial else "") if t.max_staleness else ", on-policy"),
        f"data     {len(trainer.train_set):,} train rows ({cfg.data.train_files}), {len(trainer.val_set):,} validation "
        f"rows",
        f"batch    {cfg.data.train_batch_size} prompts x {r.n} samples = {trajectories} trajectories; {updates} actor "
        f"update(s) of {a.ppo_mini_batch_size} trajectories x {a.ppo_epochs} epoch(s)",
    ]
    describe = getattr(recipe_module(cfg.recipe), "describe", None)
    return "\n".join(lines + (describe(cfg) if describe else []) + [trainer.memory.summary()])


def main(argv: list[str] | None = None) -> int:
    return cli.run(argv, train, help_text, stopped=(TrainingStopped, EnvironmentUnavailable))


def train(files: list[str], overrides: list[str]) -> int:
    """Build the config and the trainer, print the summary, fit, print the results; errors are ``cli.run``'s to
    report (exit 2 for unusable input, 3 for a run stopped on purpose)."""
    cfg = load_config(overrides, files)
    check_loggers(cfg.trainer.logger)  # before any model loads
    check_paths(cfg)  # and the files it names exist: both refused before torch is imported
    try:
        trainer = build_trainer(cfg)
    except EnvironmentUnavailable as err:  # the service does not answer at start-up: unusable input, not a stop
        return cli.failed(err, cli.EXIT_INPUT)
    print(startup_summary(cfg, trainer), flush=True)
    try:
        final = trainer.fit()
    finally:
        trainer.shutdown()
    if trainer.already_complete:
        print(cli.already_complete(trainer.step, trainer.total_steps, trainer.out_dir))
    for key in sorted(k for k in final if k.startswith(trainer.recipe.summary_prefixes)):
        before = trainer.initial_validation.get(key)
        if cfg.trainer.val_only or before is None:
            print(f"{key}: {final[key]:.3f}")
        else:
            print(f"{key}: before {before:.3f} -> after {final[key]:.3f}")
    print(f"metrics: {trainer.tracker.jsonl_path}  curves: {trainer.out_dir / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
