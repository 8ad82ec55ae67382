"""The column table of a training step: which phase reads, adds and replaces which column of the batch.

A step's ``Batch`` grows phase by phase (``PPOTrainer.run_step``): the dataset's prompts, the recipe's generation,
the loss mask, the reward, dynamic sampling, overlong, the workers' log-probs and values, the advantages, the
updates. ``STEP`` lists the phases in that order; each declares

* ``reads``: columns that must be in the batch when the phase starts (``require``); ``may_read``: columns it reads
  when they are there or when the config asks for them (checked only here, against the table);
* ``adds`` / ``may_add`` / ``prefixes``: the new columns it makes (always / depending on the config or the recipe /
  any number named ``<prefix><name>``, e.g. ``reward/em``), with their shape and meaning;
* ``replaces``: columns an earlier phase made that it may overwrite, in the same shape.

Every write goes through ``write(batch, phase, **columns)`` (``merge`` for a worker's returned ``Batch``), which
raises ``ColumnError`` naming the phase and the column when a phase writes a column it does not declare, adds a
column the batch already has (a column is written once) or replaces one the batch does not have, or writes a
column in another shape than the table's. ``require`` raises it when a phase reads a column that no earlier
phase made. The table itself is checked on import: every read, kept or replaced column is added by an earlier
phase, and no two phases add the same column.

Shapes: ``B`` rows (prompts x rollout.n), ``P`` prompt columns (left-padded), ``R`` response columns (right-padded;
every response starts at column ``P`` of ``input_ids``). A 2-D shape is a tensor in ``Batch.tensors``; ``B`` alone
is one value per row, a numpy array in ``Batch.non_tensors``. ``Batch.meta`` is not a column and not in the table
(nor a channel for metrics: each phase returns its own, ``step_metrics.StepResult``).

The generate phase is the recipe's generation contract: its row is what ``recipe.check_generated`` checks right
after every generation (the recipe returns a new batch holding the prompts' columns and the ones it adds; its own
extra per-row columns are declared in ``Recipe.columns``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.protocol import Batch, as_row_array


@dataclass(frozen=True)
class Column:
    shape: str  # "B, R", "B, P", "B, P+R" (a tensor) or "B" (one value per row, a non-tensor column)
    meaning: str

    @property
    def is_tensor(self) -> bool:
        return self.shape != "B"


@dataclass(frozen=True)
class Phase:
    name: str
    where: str  # the code that runs it
    reads: tuple[str, ...] = ()
    may_read: tuple[str, ...] = ()
    keeps: tuple[str, ...] = ()  # generate only: earlier columns its new batch must still hold
    adds: dict[str, Column] = field(default_factory=dict)
    may_add: dict[str, Column] = field(default_factory=dict)
    prefixes: dict[str, Column] = field(default_factory=dict)
    replaces: tuple[str, ...] = ()

    def column(self, name: str) -> Column | None:
        """The declaration of a column this phase makes (``None``: it makes no such column)."""
        made = {**self.adds, **self.may_add}
        if name in made:
            return made[name]
        return next((c for prefix, c in self.prefixes.items() if name.startswith(prefix)), None)


class ColumnError(ValueError):
    """A phase broke the column table: the message names the phase and the column."""


MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")  # what a forward pass reads
SCORED = ("loss_mask", "response_mask", "info_mask")  # which of its tokens a log-prob pass scores

STEP: tuple[Phase, ...] = (
    Phase("prompts", "verl.utils.dataset.PromptDataset.batch", adds={
        "raw_prompt_ids": Column("B", "prompt token ids, chat template applied (a list per row)"),
        "data_source": Column("B", "the dataset a row comes from (the reward and the per-source metrics)"),
        "ground_truth": Column("B", "the reward's target (e.g. {'target': [answers]})"),
        "extra_info": Column("B", "the dataset's extra per-row data"),
        "uid": Column("B", "group id: equal for the rollout.n samples of one prompt (GRPO, RLOO group by it)"),
        "index": Column("B", "the prompt's row in the dataset (trajectory records; uid is made from it)"),
    }),
    Phase("generate", "the recipe's generate (recipe.Recipe.generate), checked by recipe.check_generated",
          reads=("raw_prompt_ids",), keeps=("uid", "data_source", "ground_truth", "extra_info"), adds={
              "prompts": Column("B, P", "prompt token ids, left-padded"),
              "responses": Column("B, R", "response token ids (sampled + inserted), right-padded"),
              "input_ids": Column("B, P+R", "prompts then responses"),
              "attention_mask": Column("B, P+R", "1 = a real token, 0 = padding"),
              "position_ids": Column("B, P+R", "positions counting real tokens only"),
              "response_mask": Column("B, R", "1 = a real response token, 0 = padding"),
              "info_mask": Column("B, R", "1 = sampled by the policy (trained), 0 = inserted by the environment or "
                                          "padding"),
              "truncated": Column("B", "bool: a length budget cut the trajectory (algorithm.overlong)"),
          }, may_add={
              "rollout_log_probs": Column("B, R", "engine log-probs of sampled tokens (0 elsewhere; TIS, rollout/*)"),
              "min_version": Column("B", "oldest policy version that sampled a token of the row (pipeline.py)"),
              "max_version": Column("B", "newest policy version that sampled a token of the row"),
          }),
    Phase("loss_mask", "PPOTrainer.generate", reads=("response_mask", "info_mask"), adds={
        "loss_mask": Column("B, R", "1 = the token counts in every loss, advantage and token metric: response_mask "
                                    "* info_mask under actor.state_masking, else response_mask"),
    }),
    Phase("reward", "verl.trainer.reward.RewardManager.score_batch",
          reads=("responses", "response_mask", "loss_mask", "data_source", "ground_truth", "extra_info"), adds={
              "token_level_scores": Column("B, R", "the row's score on its last loss_mask token, 0 elsewhere"),
              "score": Column("B", "the row's score (the task's, e.g. exact match)"),
              "response_text": Column("B", "the decoded response (real tokens only)"),
          }, may_add={
              "turn_scores": Column("B", "a list per row, one score per policy turn (reward.turn_term)"),
          }, prefixes={
              "reward/": Column("B", "a term of the recipe's composite reward, logged as its mean"),
          }),
    Phase("dynamic_sampling", "verl.trainer.pipeline.fill_batch (algorithm.filter_groups)",
          reads=("uid", "score"), replaces=("uid",)),  # rounds after the first: uid + "#round"
    Phase("overlong", "verl.trainer.reward.apply_overlong (algorithm.overlong.mode)",
          reads=("truncated", "loss_mask", "response_mask", "token_level_scores"),
          replaces=("loss_mask", "token_level_scores")),  # mask: loss_mask; soft_penalty: token_level_scores
    # the passes score only the tokens loss_mask or the policy's sampling marks (verl/workers/scored_tokens.py)
    Phase("old_log_prob", "ActorRolloutWorker.compute_log_prob", reads=MODEL_INPUTS, may_read=SCORED, adds={
        "old_log_probs": Column("B, R", "log-probs of the response tokens under the weights that sampled this step "
                                        "(0 where no loss or metric reads them: retrieved text, padding)"),
        "entropy": Column("B, R", "the policy's entropy at each response token (0 where old_log_probs is)"),
    }),
    Phase("ref", "RefWorker.compute_ref_log_prob (the actor's under LoRA)", reads=MODEL_INPUTS, may_read=SCORED,
          adds={
        "ref_log_prob": Column("B, R", "log-probs of the response tokens under the reference model (0 where "
                                       "old_log_probs is)"),
    }),
    Phase("rewards", "verl.trainer.reward.token_rewards",
          reads=("token_level_scores", "loss_mask", "response_mask", "info_mask"),
          may_read=("old_log_probs", "ref_log_prob", "turn_scores"), adds={
              "token_level_rewards": Column("B, R", "token_level_scores minus the KL penalty (use_kl_in_reward) plus "
                                                    "the turn rewards (turn_reward_coef)"),
          }),
    # CriticWorker.compute_values, or, on-policy (config.computes_values_in_update), CriticWorker.update_on_policy:
    # the update's own forward gives the values and token_level_rewards its targets; update_critic then does not run
    Phase("values", "CriticWorker.compute_values | CriticWorker.update_on_policy", reads=(*MODEL_INPUTS, "loss_mask"),
          may_read=("token_level_rewards",), adds={
              "values": Column("B, R", "the critic's value of the state each response token was chosen in (0 where "
                                       "loss_mask is 0)"),
          }),
    Phase("advantages", "verl.trainer.reward.compute_advantages",
          reads=("token_level_rewards", "loss_mask", "response_mask", "info_mask"),
          may_read=("values", "uid", "turn_scores"), adds={
              "advantages": Column("B, R", "the estimator's advantages (algorithm.adv_estimator)"),
              "returns": Column("B, R", "the estimator's returns (the critic's targets)"),
          }),
    Phase("update_critic", "CriticWorker.update_critic", reads=(*MODEL_INPUTS, "loss_mask", "values", "returns")),
    Phase("update_actor", "ActorRolloutWorker.update_actor",
          reads=(*MODEL_INPUTS, "loss_mask", "advantages"),
          # old_log_probs: absent when the update is on-policy (config.recomputes_old_log_probs); ref_log_prob:
          # actor.use_kl_loss; rollout_log_probs: actor.tis_cap and rollout/*; info_mask: rollout/* then
          may_read=("old_log_probs", "ref_log_prob", "rollout_log_probs", "response_mask", "info_mask")),
)

PHASES: dict[str, Phase] = {p.name: p for p in STEP}


def made_by(name: str) -> str:
    """The phase that adds column ``name`` ("the recipe" for a column of the recipe's own)."""
    return next((p.name for p in STEP if p.column(name) is not None), "the recipe")


def check_table(step: tuple[Phase, ...]) -> None:
    """ColumnError unless every column a phase reads, keeps or replaces is added by an earlier phase and no column
    or prefix is added by two phases."""
    made: dict[str, str] = {}
    prefixes: dict[str, str] = {}
    for p in step:
        for name in (*p.reads, *p.may_read, *p.keeps, *p.replaces):
            if name not in made and not name.startswith(tuple(prefixes)):
                raise ColumnError(f"column table: phase {p.name!r} reads or replaces column {name!r}, which no "
                                  "earlier phase adds")
        for name in (*p.adds, *p.may_add, *p.prefixes):
            if name in made or name in prefixes or name.startswith(tuple(prefixes)):
                raise ColumnError(f"column table: phase {p.name!r} adds column {name!r}, which phase "
                                  f"{made.get(name) or prefixes.get(name) or 'an earlier one'!r} adds already")
        made.update({name: p.name for name in (*p.adds, *p.may_add)})
        prefixes.update({prefix: p.name for prefix in p.prefixes})


check_table(STEP)


def phase(name: str) -> Phase:
    if name not in PHASES:
        raise ColumnError(f"no phase {name!r} in the column table (verl/trainer/columns.py): {list(PHASES)}")
    return PHASES[name]


def sizes(batch: Batch, rows: int | None = None) -> dict[str, int]:
    """The sizes of the shape letters that ``batch`` tells (B always; P and R once prompts / responses exist)."""
    out = {"B": len(batch) if rows is None else rows}
    for letter, name in (("P", "prompts"), ("R", "responses")):
        if isinstance(batch.tensors.get(name), torch.Tensor) and batch.tensors[name].dim() == 2:
            out[letter] = batch.tensors[name].shape[1]
    if "P" in out and "R" in out:
        out["P+R"] = out["P"] + out["R"]
    return out


def shape_problem(name: str, value: Any, column: Column, known: Mapping[str, int]) -> str | None:
    """What is wrong with ``value`` as column ``name`` (``None``: nothing), given the known sizes."""
    if not column.is_tensor:
        if isinstance(value, torch.Tensor) or not hasattr(value, "__len__") or len(value) != known["B"]:
            return f"{name!r} is not one value per row (B = {known['B']}: {column.meaning})"
        return None
    dims = column.shape.split(", ")
    if not isinstance(value, torch.Tensor) or value.dim() != len(dims):
        return f"{name!r} is not a {len(dims)}-D tensor ({column.shape}: {column.meaning})"
    if any(d in known and n != known[d] for d, n in zip(dims, value.shape)):
        expected = [known.get(d, "?") for d in dims]
        return (f"{name!r} has shape {list(value.shape)}, expected [{column.shape}] = {expected} "
                f"({column.meaning})")
    return None


# ------------------------------------------------------------------ the checked operations
_watchers: list[Callable[[str, str, Batch], None]] = []


@contextlib.contextmanager
def watch() -> Iterator[list[tuple[str, str, frozenset[str]]]]:
    """Inside, every ``require`` (event "reads", before the phase), every write (event "writes", after it) and every
    checked generation (``recipe.check_generated``: "writes" of phase "generate") is recorded as (event, phase, the
    batch's column names), from any thread."""
    events: list[tuple[str, str, frozenset[str]]] = []
    watcher = lambda event, name, batch: events.append((event, name, frozenset(batch.keys())))  # noqa: E731
    _watchers.append(watcher)
    try:
        yield events
    finally:
        _watchers.remove(watcher)


def notify(event: str, name: str, batch: Batch) -> None:
    for watcher in list(_watchers):
        watcher(event, name, batch)


def require(batch: Batch, name: str) -> Batch:
    """``batch`` if it holds every column phase ``name`` reads; else ColumnError naming the phase and the column."""
    for column in phase(name).reads:
        if column not in batch:
            raise ColumnError(f"phase {name!r} reads column {column!r} before any phase made it (phase "
                              f"{made_by(column)!r} adds it and has not run on this batch)")
    notify("reads", name, batch)
    return batch


def write(batch: Batch, name: str, **new: Any) -> Batch:
    """Write the columns ``new`` into ``batch`` (in place; returned) as phase ``name``: each must be one the phase
    adds (and the batch lacks) or replaces (and the batch has), in the table's shape; else ColumnError, and nothing
    is written."""
    p = phase(name)
    known = sizes(batch)
    checked = []
    for column, value in new.items():
        declared = p.column(column)
        if declared is not None:
            if column in batch:
                raise ColumnError(f"phase {name!r} adds column {column!r}, but the batch already has it: a column "
                                  "is written once (a phase that overwrites it declares it in its replaces)")
        elif column in p.replaces:
            if column not in batch:
                raise ColumnError(f"phase {name!r} replaces column {column!r}, but the batch has none (phase "
                                  f"{made_by(column)!r} adds it and has not run on this batch)")
            declared = phase(made_by(column)).column(column)
        else:
            raise ColumnError(f"phase {name!r} writes column {column!r}, which the column table does not let it "
                              f"write (it adds {[*p.adds, *p.may_add, *(f'{x}*' for x in p.prefixes)]}, replaces "
                              f"{list(p.replaces)}; verl/trainer/columns.py)")
        problem = shape_problem(column, value, declared, known)
        if problem is None and column in p.replaces and declared.is_tensor and value.shape != batch[column].shape:
            problem = f"{column!r} has shape {list(value.shape)}, the column it replaces {list(batch[column].shape)}"
        if problem is not None:
            raise ColumnError(f"phase {name!r} writes a column whose {problem}")
        checked.append((column, value, declared.is_tensor))
    for column, value, is_tensor in checked:
        if is_tensor:
            batch.tensors[column] = value
        else:
            batch.non_tensors[column] = as_row_array(value)
    notify("writes", name, batch)
    return batch


def merge(batch: Batch, name: str, new: Batch) -> Batch:
    """``write`` the columns of ``new`` (a worker's returned ``Batch``) into ``batch`` as phase ``name``."""
    if len(new) != len(batch):
        raise ColumnError(f"phase {name!r} returned {len(new)} rows for a batch of {len(batch)}")
    return write(batch, name, **new.tensors, **new.non_tensors)


def run(batch: Batch, name: str, fn: Callable[[Batch], Batch]) -> Batch:
    """Phase ``name`` as one call: ``require`` its reads, ``fn(batch)`` -> a ``Batch`` of new columns, ``merge``."""
    return merge(batch, name, fn(require(batch, name)))


def allowed_through(name: str) -> tuple[set[str], tuple[str, ...]]:
    """(the column names, the prefixes) that the phases up to and including ``name`` may have made."""
    names: set[str] = set()
    prefixes: tuple[str, ...] = ()
    for p in STEP[:list(PHASES).index(phase(name).name) + 1]:
        names.update(p.adds, p.may_add)
        prefixes += tuple(p.prefixes)
    return names, prefixes


def undeclared(keys: set[str] | frozenset[str], name: str, own: Mapping[str, Column] = {}) -> list[str]:
    """The columns among ``keys`` that no phase up to ``name`` (nor the recipe's ``own``) declares."""
    names, prefixes = allowed_through(name)
    return sorted(k for k in keys if k not in names and k not in own and not k.startswith(prefixes))

