"""The seam between the generic trainer and a task: a recipe plugs in generation, reward and metrics.

The trainer (``ppo_trainer.PPOTrainer``) knows no task. The config key ``recipe`` names a Python
module; what the trainer reads of it:

* ``build_recipe(cfg, tokenizer, generator) -> Recipe`` (required); ``generator`` is the driver's handle on
  the rollout engines of all actor ranks (``verl.single_controller.rollout``);
* ``CONFIG_CLASS``: its config, a dataclass subclass of ``verl.config.Config`` adding the task's sections
  (default ``Config``), and ``BASE_CONFIG``: the path of its YAML of defaults (default none); read by
  ``verl.config.load_config``, which imports the module before the config is merged, so what the module
  registers (reward terms, estimators) is valid in the config;
* ``HELP`` (text) and ``describe(cfg) -> list[str]`` (start-up summary lines), both optional, printed by
  ``verl.trainer.main_ppo``.

The trainer imports the module by name, so dependencies point one way: a recipe imports ``verl``,
``verl`` never imports a recipe. The search agent is ``search_r1.recipe`` (the config's default).

The generation function's output is checked at the seam: the trainer calls ``check_generated`` right
after every generation, so a recipe that leaves out or mis-shapes a field (``GENERATED_TENSORS``,
``GENERATED_NON_TENSORS``) fails there, naming the field, instead of deep inside a worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from verl.config import Config, ConfigError, recipe_module
from verl.protocol import Batch
from verl.trainer.reward import ScoreFn
from verl.workers.rollout.base import Generator, SamplingParams

# Prompts (``raw_prompt_ids`` and the dataset's columns, each row repeated rollout.n times) + sampling ->
# trajectories: GENERATED_TENSORS (``verl.utils.seq.pack_trajectories`` makes them), the input non-tensor
# columns (GENERATED_NON_TENSORS among them) and, optionally, ``meta["gen_metrics"]``.
GenerateFn = Callable[[Batch, SamplingParams], Batch]

# The tensors a generated batch must hold: name -> (shape, meaning). B rows (prompts x n), P prompt columns
# (left-padded), R response columns (right-padded).
GENERATED_TENSORS: dict[str, tuple[str, str]] = {
    "prompts": ("B, P", "prompt token ids, left-padded"),
    "responses": ("B, R", "response token ids (sampled + inserted), right-padded"),
    "input_ids": ("B, P+R", "prompts then responses"),
    "attention_mask": ("B, P+R", "1 = a real token, 0 = padding"),
    "position_ids": ("B, P+R", "positions counting real tokens only"),
    "response_mask": ("B, R", "1 = a real response token, 0 = padding"),
    "info_mask": ("B, R", "1 = sampled by the policy (trained), 0 = inserted by the environment or padding"),
}
# Optional, checked when present: the engine's log-prob of each sampled token (0 elsewhere), for TIS and rollout/*.
OPTIONAL_TENSORS: dict[str, tuple[str, str]] = {"rollout_log_probs": ("B, R", "engine log-probs of sampled tokens")}
# Per-row columns the trainer reads: group ids (uid: equal for the samples of one prompt), the reward's inputs, and
# ``truncated`` (bool: a length budget cut the trajectory; algorithm.overlong).
GENERATED_NON_TENSORS = ("uid", "data_source", "ground_truth", "extra_info", "truncated")
# Extra per-row validation metrics: (response texts, generated batch) -> {name: per-row values}.
RowMetricsFn = Callable[[list[str], Batch], dict[str, np.ndarray]]


@dataclass
class Recipe:
    """What a task plugs into the trainer."""

    generate: GenerateFn
    score: ScoreFn  # replaced by custom_reward_function when that is set
    row_metrics: RowMetricsFn | None = None  # logged as val/<name> and val/<name>/<data_source>
    summary_prefixes: tuple[str, ...] = ("val/",)  # final metrics main_ppo prints (before -> after)
    # Optional composite reward over the generated batch: (batch, response texts, tokenizer) -> an object with
    # ``scores`` ([B] or None: use ``score``), ``row_terms`` ({"reward/<term>": [B]}, logged) and ``turn_scores``
    # (per row, per policy turn, or None) -- search_r1.reward.terms.RewardDetails.
    reward_details: Callable | None = None


class RecipeOutputError(ValueError):
    """A recipe's generation returned a batch without a field the trainer needs, or with a wrong shape."""


def check_generated(batch: Batch, rows: int) -> Batch:
    """``batch`` unchanged if it holds every field of the generation contract with its shape for ``rows`` rows;
    else RecipeOutputError naming the first missing or mis-shaped field (see GENERATED_TENSORS)."""
    def fail(problem: str) -> RecipeOutputError:
        return RecipeOutputError(f"the recipe's generate returned a batch {problem} (the contract: "
                                 "verl.trainer.recipe.GENERATED_TENSORS and GENERATED_NON_TENSORS)")

    for name in (*GENERATED_TENSORS, *GENERATED_NON_TENSORS):
        if name not in batch:
            raise fail(f"without {name!r}: it needs every one of {[*GENERATED_TENSORS, *GENERATED_NON_TENSORS]}")
    fields = {**GENERATED_TENSORS, **{k: v for k, v in OPTIONAL_TENSORS.items() if k in batch}}
    for name in fields:
        if not isinstance(batch[name], torch.Tensor) or batch[name].dim() != 2:
            raise fail(f"whose {name!r} is not a 2-D tensor ({fields[name][0]}: {fields[name][1]})")
    sizes = {"B": rows, "P": batch["prompts"].shape[1], "R": batch["responses"].shape[1]}
    sizes["P+R"] = sizes["P"] + sizes["R"]
    for name, (dims, meaning) in fields.items():
        expected = tuple(sizes[d] for d in dims.split(", "))
        if tuple(batch[name].shape) != expected:
            raise fail(f"whose {name!r} has shape {list(batch[name].shape)}, expected [{dims}] = {list(expected)} "
                       f"({meaning}; B = {rows} prompts x n)")
    if ((batch["info_mask"] != 0) & (batch["response_mask"] == 0)).any():
        raise fail("whose 'info_mask' marks padding as sampled by the policy (it must be 0 where response_mask is 0)")
    if not all(isinstance(cut, bool | np.bool_) for cut in batch["truncated"]):
        raise fail("whose 'truncated' is not one bool per row (True = the length budget cut the trajectory)")
    return batch


class EnvironmentUnavailable(RuntimeError):
    """Raised by a recipe's generation when a service its environment needs (the retrieval service) stayed
    down past its own patience; the trainer then saves a checkpoint of the last finished step and stops."""


RecipeBuilder = Callable[[Config, object, Generator], Recipe]


def load_recipe(module_name: str) -> RecipeBuilder:
    """``build_recipe`` of the module named by the config key ``recipe``; ConfigError naming the key otherwise."""
    module = recipe_module(module_name)
    builder = getattr(module, "build_recipe", None)
    if not callable(builder):
        raise ConfigError(f"config key recipe={module_name!r}: the module defines no "
                          "build_recipe(cfg, tokenizer, generator) -> verl.trainer.recipe.Recipe")
    return builder
