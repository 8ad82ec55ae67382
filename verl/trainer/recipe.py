"""The seam between the generic trainer and a task: a recipe plugs in generation, reward and metrics.

The trainer (``ppo_trainer.PPOTrainer``) knows no task. The config key ``recipe`` names a Python
module whose ``build_recipe(cfg, tokenizer, generator)`` returns a ``Recipe``; ``generator`` is the
driver's handle on the rollout engines of all actor ranks (``verl.single_controller.rollout``).
The trainer imports the module by name, so dependencies point one way: a recipe imports ``verl``,
``verl`` never imports a recipe. The search agent is ``search_r1.recipe`` (the config's default).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from verl.config import Config, ConfigError
from verl.protocol import Batch
from verl.trainer.reward import ScoreFn
from verl.workers.rollout.base import Generator, SamplingParams

# Prompts (``raw_prompt_ids`` and the dataset's columns) + sampling -> trajectories: the tensors of
# ``verl.utils.seq.pack_trajectories`` (with ``info_mask``), the input columns, and ``meta["gen_metrics"]``.
GenerateFn = Callable[[Batch, SamplingParams], Batch]
# Extra per-row validation metrics: (response texts, generated batch) -> {name: per-row values}.
RowMetricsFn = Callable[[list[str], Batch], dict[str, np.ndarray]]


@dataclass
class Recipe:
    """What a task plugs into the trainer."""

    generate: GenerateFn
    score: ScoreFn  # replaced by custom_reward_function when that is set
    row_metrics: RowMetricsFn | None = None  # logged as val/<name> and val/<name>/<data_source>
    summary_prefixes: tuple[str, ...] = ("val/",)  # final metrics main_ppo prints (before -> after)


class EnvironmentUnavailable(RuntimeError):
    """Raised by a recipe's generation when a service its environment needs (the retrieval service) stayed
    down past its own patience; the trainer then saves a checkpoint of the last finished step and stops."""


RecipeBuilder = Callable[[Config, object, Generator], Recipe]


def load_recipe(module_name: str) -> RecipeBuilder:
    """``build_recipe`` of the module named by the config key ``recipe``; ConfigError naming the key otherwise."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not module_name.startswith(err.name):
            raise  # the recipe exists but one of its own imports is missing
        raise ConfigError(f"config key recipe={module_name!r}: no such module ({err})") from err
    builder = getattr(module, "build_recipe", None)
    if not callable(builder):
        raise ConfigError(f"config key recipe={module_name!r}: the module defines no "
                          "build_recipe(cfg, tokenizer, generator) -> verl.trainer.recipe.Recipe")
    return builder
