"""A second recipe, for the tests: arithmetic questions ("What is 3+4?"), scored by the integer in the response.

It proves the recipe seam (``verl.trainer.recipe``): a task with its own config section (``arith.*`` on
``ArithConfig``, a subclass of ``verl.config.Config``) and no YAML of defaults (its keys' defaults are the
dataclass's) trains through the same trainer as the search recipe, with one engine call per batch and no
environment, and the search recipe's keys are unknown under it. Run it with ``recipe=tests.verl.trainer.arith_recipe``.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

from verl.config import Config, section, setting
from verl.protocol import Batch
from verl.trainer.recipe import Recipe
from verl.utils.seq import pack_trajectories
from verl.workers.rollout.base import Generator, SamplingParams


@dataclass
class ArithSection:
    max_operand: int = setting(9, "Largest operand of the questions make_rows writes.", low=1, high=99)
    answer_tag: str = setting(
        "answer", "The answer is the integer inside the last <TAG>...</TAG> of the response; without one, the last "
        "integer of the response.")


@dataclass
class ArithConfig(Config):
    """The arithmetic recipe's config: the trainer's sections and ``arith``."""

    arith: ArithSection = section(ArithSection, "Arithmetic questions and how their answers are read.")


CONFIG_CLASS = ArithConfig
HELP = "The arithmetic recipe (tests/verl/trainer/arith_recipe.py):\n  arith.max_operand, arith.answer_tag"


def describe(cfg: ArithConfig) -> list[str]:
    return [f"arith    operands up to {cfg.arith.max_operand}, answers in <{cfg.arith.answer_tag}>"]


def make_rows(n: int, max_operand: int, seed: int) -> list[dict]:
    """``n`` parquet rows of the trainer's schema (``prompt`` chat messages, ``reward_model.ground_truth``)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        rows.append({"data_source": "arith", "prompt": [{"role": "user", "content": f"What is {a}+{b}?"}],
                     "reward_model": {"ground_truth": {"target": [str(a + b)]}}, "extra_info": {"index": i}})
    return rows


def answer(text: str, tag: str) -> int | None:
    """The integer in the last ``<tag>...</tag>`` of ``text``, else its last integer, else None."""
    tagged = re.findall(rf"<{re.escape(tag)}>\s*(-?\d+)\s*</{re.escape(tag)}>", text)
    numbers = tagged or re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


def score(data_source: str, solution_str: str, ground_truth: dict, extra_info: dict | None = None, *,
          tag: str) -> float:
    """1 when the response's integer is the sum, else 0."""
    return float(answer(solution_str, tag) == int(ground_truth["target"][0]))


def build_recipe(cfg: ArithConfig, tokenizer, generator: Generator) -> Recipe:
    """One engine call per batch: every response token is sampled by the policy (info_mask = 1)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def generate(batch: Batch, params: SamplingParams) -> Batch:
        prompts = [[int(t) for t in ids] for ids in batch.non_tensors["raw_prompt_ids"]]
        outputs = generator.generate(prompts, params)
        responses = [out.token_ids for out in outputs]
        tensors = pack_trajectories(prompts, responses, [[1] * len(r) for r in responses], pad_id,
                                    [out.logprobs for out in outputs] if params.logprobs else None)
        truncated = [out.finish_reason == "length" for out in outputs]
        return Batch(tensors, {**batch.non_tensors, "truncated": truncated}, batch.meta)

    return Recipe(generate=generate, score=functools.partial(score, tag=cfg.arith.answer_tag))
