"""The recipe seam: a recipe's generated batch is checked right after generation, naming the bad field.

Guards against a recipe that leaves out or mis-shapes a field (e.g. no ``info_mask``, so nothing says which
tokens the policy sampled) failing minutes later inside a worker with a KeyError or a shape error that names
no recipe, or, worse, training on the wrong tokens.
"""

from __future__ import annotations

import dataclasses

import pytest

from search_r1.recipe import build_recipe
from tests.verl.trainer.trainer_test_utils import overrides
from verl.config import load_config
from verl.protocol import Batch
from verl.trainer.cli import split_args
from verl.trainer.columns import PHASES
from verl.trainer.ppo_trainer import PPOTrainer
from verl.trainer.recipe import RecipeOutputError, check_generated
from verl.utils.seq import pack_trajectories

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`


def generated(rows: int = 4) -> Batch:
    """A well-formed generated batch: packed trajectories of ragged lengths and the per-row columns."""
    prompts = [[5] * (2 + i % 3) for i in range(rows)]
    responses = [[7] * (1 + i) for i in range(rows)]
    info = [[1] * len(r) for r in responses]
    non_tensors = {"uid": [f"row{i // 2}" for i in range(rows)], "data_source": ["nq"] * rows,
                   "ground_truth": [{"target": ["x"]}] * rows, "extra_info": [None] * rows,
                   "truncated": [i == rows - 1 for i in range(rows)]}
    return Batch(pack_trajectories(prompts, responses, info, pad_id=0), non_tensors)


def without(batch: Batch, name: str) -> Batch:
    return Batch({k: v for k, v in batch.tensors.items() if k != name},
                 {k: v for k, v in batch.non_tensors.items() if k != name}, batch.meta)


def test_a_well_formed_batch_passes_and_every_field_is_required():
    batch = generated()
    assert check_generated(batch, rows=4) is batch
    for name in [*PHASES["generate"].adds, "uid", "data_source", "ground_truth", "extra_info", "truncated"]:
        with pytest.raises(RecipeOutputError, match=f"without '{name}'"):
            check_generated(without(batch, name), rows=4)


def test_mis_shaped_fields_are_named_with_the_expected_shape():
    batch = generated()
    cut = dataclasses.replace(batch, tensors={**batch.tensors, "attention_mask": batch["attention_mask"][:, 1:]})
    expected = r"'attention_mask' has shape \[4, 7\], expected \[B, P\+R\] = \[4, 8\]"
    with pytest.raises(RecipeOutputError, match=expected):
        check_generated(cut, rows=4)
    with pytest.raises(RecipeOutputError, match=r"'prompts' has shape \[4, 4\], expected \[B, P\] = \[8, 4\]"):
        check_generated(batch, rows=8)  # the recipe returned one row per prompt instead of n
    flat = dataclasses.replace(batch, tensors={**batch.tensors, "info_mask": batch["info_mask"].flatten()[:4]})
    with pytest.raises(RecipeOutputError, match="'info_mask' is not a 2-D tensor"):
        check_generated(flat, rows=4)
    leaky = batch["info_mask"].clone()
    leaky[0, -1] = 1  # row 0's response is 1 token long: the last column is padding
    with pytest.raises(RecipeOutputError, match="marks padding as sampled by the policy"):
        check_generated(dataclasses.replace(batch, tensors={**batch.tensors, "info_mask": leaky}), rows=4)
    stop_reasons = Batch(batch.tensors, {**batch.non_tensors, "truncated": ["max_length", "answered"] * 2})
    with pytest.raises(RecipeOutputError, match="'truncated' is not one bool per row"):
        check_generated(stop_reasons, rows=4)  # a string is truthy: "answered" would count as cut


def test_trainer_stops_at_the_seam_when_the_recipe_drops_info_mask(workspace, tmp_path):
    """Through PPOTrainer.fit: the search recipe's generation, minus info_mask, fails at the first step naming it."""
    def build_broken_recipe(cfg, tokenizer, generator):
        recipe = build_recipe(cfg, tokenizer, generator)
        return dataclasses.replace(recipe, generate=lambda batch, params: without(recipe.generate(batch, params),
                                                                                  "info_mask"))

    files, args = split_args(overrides(workspace, tmp_path / "run", 1))
    trainer = PPOTrainer(load_config(args, files), build_broken_recipe)
    with pytest.raises(RecipeOutputError, match="the recipe's generate returned a batch without 'info_mask'"):
        trainer.fit()
