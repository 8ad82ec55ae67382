"""A second task in one file: arithmetic word problems, a calculator the policy calls, exact-match answers.

    python -m examples.calculator data/calc actor_rollout_ref.model.path=MODEL [key=value ...]

writes ``data/calc/train.parquet`` and ``val.parquet`` (generated problems, once) and trains the policy with GRPO
through the generic trainer (``recipe=examples.calculator``); any trainer key may follow. The policy writes
``<calc> 12 + 7 * 3 </calc>`` and reads ``<result> 33 </result>``, at most ``calc.max_calls`` times, then answers
``<answer> 33 </answer>``; the reward is 1 when the answer is the problem's integer, else 0.

What this module plugs in, and nothing else (no edit under ``verl/``; the search task, ``search_r1``, does the same):
- ``CalcFormat``: the action format (``verl.agent.format.ActionFormat``), registered as ``multi_turn.format=calc``:
  how a turn is read (``parse_tagged``), what the calculator inserts (``act``), the feedback after a turn with no
  action. The loop (turns, length budgets, masks, sync and async schedules) is ``verl.agent.loop.AgentLoop``.
- ``CalcConfig``: the trainer's config plus ``calc.*``; ``DEFAULT_FORMAT``; ``build_recipe`` (loop, reward, metrics).
- ``make_rows``: the problems, in the trainer's parquet schema.

Choices: the calculator evaluates ``+ - * / // %`` and parentheses on numbers by walking Python's ``ast`` (never
``eval``), so a policy's text cannot run code; an expression it cannot evaluate gets ``<result> error: ... </result>``
(the turn still counts as a call). A result is a few tokens (values are bounded, errors short), so none is cut; one
that does not fit the trajectory or context budget ends the row, as any insertion (``TurnContext.insert``).
"""

from __future__ import annotations

import ast
import operator
import os
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from verl.agent.format import ActionFormat, TurnContext, parse_tagged
from verl.agent.loop import AgentLoop
from verl.agent.trajectory import ActionKind, Trajectory
from verl.config import Config, section, setting
from verl.protocol import Batch
from verl.tools import action_format, register_format
from verl.trainer.columns import Column
from verl.trainer.recipe import Recipe
from verl.workers.rollout.base import GenerationOutput, Generator

STOP = ["</calc>", "</answer>"]
FEEDBACK = ("\nThat was not a calculation or an answer. Write the expression between the calc tags, or the final "
            "number between the answer tags.\n")
INSTRUCTION = ("Solve the problem. To compute, write <calc> expression </calc>; the result comes back as "
               "<result> value </result>. Give the final number as <answer> number </answer>.\nProblem: ")

# ------------------------------------------------------------------ the calculator
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
MAX_EXPRESSION = 64  # characters of one expression
MAX_MAGNITUDE = 1e12  # larger intermediate values are refused


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        value = _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError(f"a value beyond {MAX_MAGNITUDE:g}")
        return value
    raise ValueError("only numbers, + - * / // % and parentheses are allowed")


def calculate(expression: str) -> str:
    """The value of ``expression`` as the policy reads it (an integer when it is one), or ``error: why``."""
    if len(expression) > MAX_EXPRESSION:
        return f"error: at most {MAX_EXPRESSION} characters"
    try:
        value = _value(ast.parse(expression, mode="eval").body)
    except ZeroDivisionError:
        return "error: division by zero"
    except (SyntaxError, ValueError) as err:
        return f"error: {err.msg if isinstance(err, SyntaxError) else err}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


# ------------------------------------------------------------------ the action format
@dataclass
class CalcTrajectory(Trajectory):
    """A trajectory of the calculator task: the loop's fields and the calls made."""

    calls: list[str] = field(default_factory=list)  # the expressions whose result was inserted, in order


@register_format("calc")
class CalcFormat(ActionFormat):
    """``<calc> expression </calc>`` gets ``<result> value </result>``; ``<answer> n </answer>`` ends the row."""

    stop = STOP
    row_type: ClassVar[type[Trajectory]] = CalcTrajectory

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        (self._feedback_ids,) = tokenizer([FEEDBACK], add_special_tokens=False)["input_ids"]

    def parse(self, ids: list[int], out: GenerationOutput, cut: bool) -> tuple[ActionKind, str]:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return parse_tagged(text, out.finish_reason, out.stop_str, cut, act_tag="calc")

    async def act(self, ctx: TurnContext, action: Any) -> None:
        """Insert the result of the expression ``action`` (ids 0 in the loss mask); a block that does not fit the
        budgets ends the row."""
        ids = self.tokenizer(f"\n<result> {calculate(action)} </result>\n", add_special_tokens=False)["input_ids"]
        if ctx.insert(ids):
            ctx.row.calls.append(action)

    def feedback(self, ctx: TurnContext) -> list[int]:
        return self._feedback_ids

    def metrics(self, rows: list[CalcTrajectory]) -> dict[str, float]:
        return {"agent/calls_per_traj": sum(len(r.calls) for r in rows) / max(len(rows), 1)}

    def columns(self, rows: list[CalcTrajectory]) -> dict[str, list]:
        return {"num_calls": [len(r.calls) for r in rows]}


# ------------------------------------------------------------------ the config
@dataclass
class CalcSection:
    max_operand: int = setting(20, "Largest operand of the generated problems (make_rows).", low=2, high=10_000)
    max_calls: int = setting(
        2, "Calculator calls per trajectory; one final answer turn follows the last one.", low=1)


@dataclass
class CalcConfig(Config):
    """The calculator task's config: the trainer's sections and ``calc``."""

    calc: CalcSection = section(CalcSection, "Arithmetic word problems and the calculator.")


CONFIG_CLASS = CalcConfig
DEFAULT_FORMAT = "calc"
HELP = ("The calculator task (examples/calculator.py; python -m examples.calculator DATA_DIR key=value ...):\n"
        "  calc.max_operand, calc.max_calls   the problems' size and the calls a trajectory may make")


def describe(cfg: CalcConfig) -> list[str]:
    return [f"calc     operands up to {cfg.calc.max_operand}, up to {cfg.calc.max_calls} calculator calls"]


# ------------------------------------------------------------------ the problems and the reward
_NAMES, _ITEMS = ("Ann", "Bo", "Cy", "Dee"), ("apple", "card", "stamp", "marble")
# (text, answer, whether a must be a multiple of b) of a problem from its operands a, b, c, a name and an item
_PROBLEMS = (
    ("{n} has {a} {i}s and buys {b} packs of {c} {i}s each. How many {i}s does {n} have now?",
     lambda a, b, c: a + b * c, False),
    ("{n} had {a} {i}s, gave away {b} and then found {c}. How many {i}s does {n} have?", lambda a, b, c: a - b + c,
     False),
    ("A box holds {a} {i}s. How many {i}s are in {b} boxes and {c} loose {i}s?", lambda a, b, c: a * b + c, False),
    ("{n} shares {a} {i}s equally among {b} friends and keeps {c} more. How many {i}s does each friend get, plus "
     "the kept ones?", lambda a, b, c: a // b + c, True),
)


def make_rows(n: int, max_operand: int, seed: int) -> list[dict]:
    """``n`` problems with integer answers, as rows of the trainer's parquet schema (``prompt`` chat messages,
    ``reward_model.ground_truth.target``)."""
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        text, answer, divisible = rng.choice(_PROBLEMS)
        b, c = rng.randint(2, max_operand), rng.randint(1, max_operand)
        a = b * rng.randint(1, max_operand) if divisible else rng.randint(b, max_operand + b)
        question = text.format(n=rng.choice(_NAMES), i=rng.choice(_ITEMS), a=a, b=b, c=c)
        rows.append({"data_source": "calc", "prompt": [{"role": "user", "content": INSTRUCTION + question}],
                     "reward_model": {"ground_truth": {"target": [str(answer(a, b, c))]}},
                     "extra_info": {"index": index}})
    return rows


def answer_of(text: str) -> int | None:
    """The integer of the last ``<answer> n </answer>`` of a response, None without one."""
    found = re.findall(r"<answer>\s*(-?\d+)\s*</answer>", text)
    return int(found[-1]) if found else None


def score(data_source: str, solution_str: str, ground_truth: dict, extra_info: dict | None = None) -> float:
    """1 when the response's answer is the problem's integer (exact match), else 0."""
    return float(answer_of(solution_str) == int(ground_truth["target"][0]))


def row_metrics(texts: list[str], batch: Batch) -> dict[str, np.ndarray]:
    """Validation per row: exact match and calculator calls."""
    em = [score("calc", text, truth) for text, truth in zip(texts, batch["ground_truth"], strict=True)]
    return {"em": np.array(em), "calls": np.asarray(batch["num_calls"], dtype=float)}


def build_recipe(cfg: CalcConfig, tokenizer: Any, generator: Generator) -> Recipe:
    """The agent loop in this task's format over the trainer's engines, exact match as the reward."""
    loop = AgentLoop(tokenizer, generator, action_format(cfg)(tokenizer), cfg.data, cfg.actor_rollout_ref.rollout,
                     max_turns=cfg.calc.max_calls)
    columns = {"stop_reason": Column("B", "why the trajectory ended (StopReason value)"),
               "num_turns": Column("B", "policy turns of the trajectory"),
               "num_calls": Column("B", "calculator calls whose result was inserted")}
    return Recipe(generate=loop, score=score, row_metrics=row_metrics, summary_prefixes=("val/em", "val/calls"),
                  columns=columns)


# ------------------------------------------------------------------ the command
GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "data.max_prompt_length=256", "data.max_start_length=256",
        "data.max_response_length=48", "data.max_trajectory_length=160", "trainer.total_training_steps=50",
        "trainer.test_freq=10"]


def write_problems(out: Path) -> None:
    """``out/train.parquet`` (512 problems) and ``out/val.parquet`` (64), each written unless it is there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, count, seed in (("train", 512, 0), ("val", 64, 1)):
        if not (out / f"{name}.parquet").is_file():
            out.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(make_rows(count, CalcSection.max_operand, seed)),
                           out / f"{name}.parquet")


def command(out: Path, overrides: list[str]) -> list[str]:
    """The trainer's command line for the problems in ``out``: this recipe, GRPO's settings, then ``overrides``."""
    return [sys.executable, "-m", "verl.trainer.main_ppo", "recipe=examples.calculator",
            f"data.train_files={out / 'train.parquet'}", f"data.val_files={out / 'val.parquet'}", *GRPO, *overrides]


if __name__ == "__main__":
    if len(sys.argv) < 2 or "=" in sys.argv[1]:
        sys.exit("usage: python -m examples.calculator DATA_DIR [key=value ...]")
    write_problems(Path(sys.argv[1]))
    # the trainer in place of this process: it imports this file as the module examples.calculator (run as
    # __main__, its format would be registered twice)
    os.execv(sys.executable, command(Path(sys.argv[1]), sys.argv[2:]))
