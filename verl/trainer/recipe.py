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
* ``DEFAULT_FORMAT`` (optional): the action format of the agent loop (``verl.agent``) when
  ``actor_rollout_ref.rollout.multi_turn.format`` is null (``verl.tools.action_format``), and ``DEFAULT_TOOLS``
  (optional): the ``verl.tools.ToolSpec`` list a run in a format with tools offers when
  ``actor_rollout_ref.rollout.multi_turn.tool_config_path`` is null (``verl.tools.run_tool_specs``).
* ``response_tokens(cfg, tokenizer, questions) -> (tokens, words)`` (optional): the longest response the task's
  trajectories can have at the lengths its environment really inserts (``questions``: a sample of the training
  data's), for the start-up memory estimate (``expected_row_lengths``); without it, ``data.max_trajectory_length``.
* ``alarms(cfg) -> list[Alarm]`` (optional): the task's health alarms (``verl.trainer.alarms``), for example ones that
  read its trajectories' text (think blocks, answers, queries) or a ``ScoreVsSignal`` on its recall metric; built
  from the config alone (``recipe_alarms``), so a finished run's directory can be replayed through them too.

The trainer imports the module by name, so dependencies point one way: a recipe imports ``verl``,
``verl`` never imports a recipe. The config's default is the recipe the installed packages register
(``verl.config.rl.installed_recipe``; for example this project's search agent, ``search_r1.recipe``); another is named
with ``recipe=MODULE`` (``examples/calculator.py``).

The generation function's output is checked at the seam: the trainer calls ``check_generated`` right
after every generation, so a recipe that leaves out or mis-shapes a column (the generate phase of the column
table, ``verl.trainer.columns``) or returns one nobody declares fails there, naming it, instead of deep inside
a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from verl.config import Config, ConfigError, recipe_module
from verl.errors import EnvironmentUnavailable  # noqa: F401 -- raised here, defined below torch
from verl.protocol import Batch
from verl.trainer.alarms import Alarm
from verl.trainer.columns import PHASES, Column, ColumnError, made_by, notify, shape_problem, sizes, undeclared
from verl.trainer.reward import ScoreFn
from verl.utils.dataset import PromptDataset
from verl.workers.memory import RowLengths
from verl.workers.rollout.base import Generator, SamplingParams

# Prompts (the dataset's columns, each row repeated rollout.n times) + sampling -> trajectories: a new batch holding
# the prompts' columns and those the generate phase of the column table adds (``verl.trainer.columns.STEP``;
# ``verl.utils.seq.pack_trajectories`` makes its tensors), the recipe's own (``Recipe.columns``) and, optionally,
# ``meta["gen_metrics"]``.
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
    # Optional composite reward over the generated batch: (batch, response texts, tokenizer) -> an object with
    # ``scores`` ([B] or None: use ``score``), ``row_terms`` ({"reward/<term>": [B]}, logged) and ``turn_scores``
    # (per row, per policy turn, or None); for example a recipe's weighted sum of reward terms.
    reward_details: Callable | None = None
    # The recipe's own per-row columns in its generated batch (e.g. the search's stop_reason), name -> shape and
    # meaning; a column the table does not declare and the recipe does not either fails at generation.
    columns: dict[str, Column] = field(default_factory=dict)
    # Optional: the task's fields of each row's trajectory record (verl.utils.rollout_log), from a scored batch:
    # {field: one value per row}, e.g. the search's ``queries`` (in order) and extracted ``answer``.
    trajectory_fields: Callable[[Batch], dict[str, Sequence]] | None = None


class RecipeOutputError(ColumnError):
    """A recipe's generation returned a batch without a column the trainer needs, with a wrong shape, or with a
    column nobody declared."""


def check_generated(batch: Batch, rows: int, own: dict[str, Column] | None = None) -> Batch:
    """``batch`` unchanged if it fits the generate phase's row of the column table for ``rows`` rows: every column
    the phase adds or keeps, each in its shape, and no column that neither the table nor the recipe (``own``:
    ``Recipe.columns``) declares; else RecipeOutputError naming the first bad column."""
    own, generate = own or {}, PHASES["generate"]

    def fail(problem: str) -> RecipeOutputError:
        return RecipeOutputError(f"the recipe's generate returned a batch {problem} (the contract: the 'generate' "
                                 "phase of verl.trainer.columns.STEP, and the recipe's Recipe.columns)")

    needed = [*generate.adds, *generate.keeps]
    for name in needed:
        if name not in batch:
            raise fail(f"without {name!r}: it needs every one of {needed}")
    taken = [name for name in own if made_by(name) != "the recipe"]
    if taken:
        raise fail(f"declaring its own column {taken[0]!r}, which phase {made_by(taken[0])!r} of the table adds")
    extra = undeclared(set(batch.keys()), "generate", own)
    if extra:
        raise fail(f"with column {extra[0]!r}, which no phase declares (a recipe declares its own in Recipe.columns)")
    known = sizes(batch, rows)
    for name, column in {**generate.adds, **generate.may_add, **own}.items():
        problem = shape_problem(name, batch[name], column, known) if name in batch else None
        if problem is not None:
            raise fail(f"whose {problem}; B = {rows} prompts x n")
    if ((batch["info_mask"] != 0) & (batch["response_mask"] == 0)).any():
        raise fail("whose 'info_mask' marks padding as sampled by the policy (it must be 0 where response_mask is 0)")
    if not all(isinstance(cut, bool | np.bool_) for cut in batch["truncated"]):
        raise fail("whose 'truncated' is not one bool per row (True = the length budget cut the trajectory)")
    notify("writes", "generate", batch)
    return batch


RecipeBuilder = Callable[[Config, object, Generator], Recipe]


def load_recipe(module_name: str) -> RecipeBuilder:
    """``build_recipe`` of the module named by the config key ``recipe``; ConfigError naming the key otherwise."""
    module = recipe_module(module_name)
    builder = getattr(module, "build_recipe", None)
    if not callable(builder):
        raise ConfigError(f"config key recipe={module_name!r}: the module defines no "
                          "build_recipe(cfg, tokenizer, generator) -> verl.trainer.recipe.Recipe")
    return builder


QUESTIONS_SAMPLED = 16  # training prompts whose questions a recipe's response_tokens may try (spread over the data)


def expected_row_lengths(cfg: Config, tokenizer, dataset: PromptDataset) -> RowLengths:
    """The longest row this run's data and environment make, for the start-up memory estimate: the data's longest
    prompt (cut to data.max_start_length) and the response the recipe module's ``response_tokens`` expects for a
    sample of the training questions (the text after a prompt's last "Question:", else its last message)."""
    prompt = min(max(len(ids) for ids in dataset.prompt_ids), cfg.data.max_start_length)
    expect = getattr(recipe_module(cfg.recipe), "response_tokens", None)
    if expect is None:
        return RowLengths(prompt, cfg.data.max_trajectory_length, "the data's longest prompt; responses up to "
                          "data.max_trajectory_length")
    picked = np.linspace(0, len(dataset) - 1, num=min(QUESTIONS_SAMPLED, len(dataset))).round().astype(int)
    texts = [str(dataset.rows[i]["prompt"][-1]["content"]) for i in dict.fromkeys(picked.tolist())]
    response, words = expect(cfg, tokenizer, [text.rsplit("Question:", 1)[-1].strip() or text for text in texts])
    return RowLengths(prompt, min(response, cfg.data.max_trajectory_length), f"the data's longest prompt; {words}")


def recipe_alarms(cfg: Config) -> list[Alarm]:
    """The health alarms of the recipe module ``cfg.recipe`` (its ``alarms(cfg)``; none when it defines none)."""
    build = getattr(recipe_module(cfg.recipe), "alarms", None)
    return list(build(cfg)) if build is not None else []
