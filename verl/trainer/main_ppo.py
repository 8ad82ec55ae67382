"""Entry point: ``python -m verl.trainer.main_ppo key=value ...``.

Builds the typed config (the flat YAML + overrides, validated once), loads the recipe the config
names (``recipe``: generation loop, reward and metrics of the task; the search agent by default),
builds the trainer and calls ``PPOTrainer.fit()``. Nothing else happens here. Exit status: 0 done,
2 a config error (bad key or value, a missing file, an unusable checkpoint), 3 the run stopped on
purpose (``TrainingStopped``: too many skipped updates, or the environment stayed down).
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch

from verl.config import Config, ConfigError, load_config, to_yaml
from verl.trainer.health import TrainingStopped
from verl.trainer.ppo_trainer import PPOTrainer
from verl.trainer.recipe import EnvironmentUnavailable, load_recipe
from verl.utils.checkpoint import CheckpointError
from verl.utils.dataset import DataError

logger = logging.getLogger("verl.trainer.main_ppo")


def build_trainer(cfg: Config) -> PPOTrainer:
    """The trainer for ``cfg`` with the recipe it names (raises ConfigError for an unknown recipe)."""
    torch.manual_seed(cfg.trainer.seed)
    return PPOTrainer(cfg, load_recipe(cfg.recipe))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
        logger.info("config:\n%s", to_yaml(cfg))
        trainer = build_trainer(cfg)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        final = trainer.fit()
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (TrainingStopped, EnvironmentUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    print(json.dumps({"initial_validation": trainer.initial_validation, "final_validation": final}, indent=1))
    for key in sorted(k for k in final if k.startswith(trainer.recipe.summary_prefixes)):
        if cfg.trainer.val_only:
            print(f"{key}: {final[key]:.3f}")
        else:
            print(f"{key}: before {trainer.initial_validation.get(key, float('nan')):.3f} -> after {final[key]:.3f}")
    print(f"metrics: {trainer.tracker.jsonl_path}  curves: {trainer.out_dir / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
