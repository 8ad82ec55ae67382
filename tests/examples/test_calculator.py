"""The task in one file (``examples/calculator.py``): its calculator, its action format in the generic agent loop
(scripted turns, both schedules), and GRPO through the trainer with ``recipe=examples.calculator``.

Guards against a loop that only the search task can drive (a format reaching into the loop's state, a task that
needs an edit under ``verl/``), against a calculator that runs the policy's text as code, and against a task whose
keys, format or columns the trainer refuses or loses.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from data_prep.tiny_model import build_model, train_tokenizer
from examples.calculator import CalcConfig, CalcFormat, build_recipe, calculate, command, make_rows, score
from tests.search_r1.llm_agent.conftest import ScriptedEngine
from tests.search_r1.memorised_policy import memorise
from tests.verl.trainer.trainer_test_utils import metrics
from verl.config import ConfigError, load_config, to_yaml
from verl.protocol import Batch
from verl.trainer.main_ppo import build_trainer, startup_summary
from verl.utils.tokenizer import render_prompt
from verl.workers.rollout.base import SamplingParams

RECIPE = "recipe=examples.calculator"
GREEDY = SamplingParams(max_tokens=1, temperature=0.0)
ROWS = make_rows(12, max_operand=9, seed=0)


def result_text(expression: str) -> str:
    return f"\n<result> {calculate(expression)} </result>\n"


@pytest.fixture(scope="module")
def tokenizer():
    """A tiny BPE tokenizer over the problems and the format's tags (the demo policy's kind)."""
    texts = [r["prompt"][0]["content"] for r in ROWS] + [
        "<calc> 12 + 7 * 3 </calc>" + result_text("12 + 7 * 3") + "<answer> 33 </answer> error: division by zero "
        "That was not a calculation or an answer. Write the expression between the calc tags"] * 20
    return train_tokenizer(texts, vocab_size=500)


def test_the_calculator_computes_arithmetic_and_refuses_anything_else():
    """Guards against a calculator that runs the policy's text as Python, crashes the loop on a bad expression or
    returns floats for integer results."""
    assert [calculate(e) for e in ("12 + 7 * 3", "(2 + 3) * 4", "7 / 2", "17 // 5", "-3 + 1", "6 / 3")] == \
        ["33", "20", "3.5", "3", "-2", "2"]
    assert calculate("1 / 0") == "error: division by zero"
    for code in ("__import__('os').system('true')", "2 ** 64", "[1, 2]", "x + 1", "1 +", "9" * 70,
                 "99999999 * 99999999"):
        assert calculate(code).startswith("error: "), code


def test_the_config_has_the_tasks_keys_and_format():
    """Guards against the task's section or format being refused, and a search key being accepted under it."""
    cfg = load_config([RECIPE, "calc.max_calls=3"])
    assert isinstance(cfg, CalcConfig) and cfg.calc.max_calls == 3
    assert cfg.actor_rollout_ref.rollout.multi_turn.format == "calc"  # the recipe's DEFAULT_FORMAT, resolved
    assert "retriever" not in to_yaml(cfg)
    for bad, message in (("retriever.url=http://127.0.0.1:8000", "unknown config key 'retriever.url'"),
                         ("actor_rollout_ref.rollout.multi_turn.format=xml",
                          r"allowed null .* or one of (.*, )?calc\b"),  # wherever calc stands (formats registered)
                         ("calc.max_calls=0", r"calc\.max_calls=0 is invalid")):
        with pytest.raises(ConfigError, match=message):
            load_config([RECIPE, bad])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_format_drives_the_generic_loop(tokenizer, mode):
    """The recipe's generation function over scripted turns: a call gets its result inserted (info_mask 0), a
    turn with no action gets the feedback, a bad expression gets an error result, the final turn's call is not
    executed, and the score reads the answer; the batch carries the task's column."""
    scripts = {  # problem row -> the policy's turns
        0: ["<calc> 12 + 7 * 3 </calc>", "<answer> 33 </answer>"],
        1: ["no action here </answer>", "<answer> 4 </answer>"],
        2: ["<calc> 1 / 0 </calc>", "<calc> 2 + 2 </calc>", "<calc> 9 * 9 </calc>"],
        3: ["I give up<|im_end|>"],
    }
    prompts = [render_prompt(tokenizer, ROWS[i]["prompt"]) for i in scripts]
    engine = ScriptedEngine(tokenizer, {tuple(p): turns for p, turns in zip(prompts, scripts.values(), strict=True)})
    cfg = load_config([RECIPE, "calc.max_calls=2", f"actor_rollout_ref.rollout.mode={mode}",
                       "data.max_prompt_length=256", "data.max_start_length=256", "data.max_response_length=32",
                       "data.max_trajectory_length=128", "data.max_obs_length=16"])
    recipe = build_recipe(cfg, tokenizer, engine)
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [np.array(p) for p in prompts]
    out = recipe.generate(Batch({}, {"raw_prompt_ids": raw}), GREEDY)
    assert list(out["stop_reason"]) == ["answered", "answered", "max_turns", "eos_without_answer"]
    assert list(out["num_calls"]) == [1, 0, 2, 0] and list(out["num_turns"]) == [2, 2, 3, 1]

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    feedback = CalcFormat(tokenizer)._feedback_ids
    for row, prompt in enumerate(prompts):
        turns = engine.emitted[tuple(prompt)]
        inserted = {0: [result_text("12 + 7 * 3"), ""], 1: [None, ""],
                    2: [result_text("1 / 0"), result_text("2 + 2"), ""], 3: [""]}[row]
        expected, mask = [], []
        for turn_ids, text in zip(turns, inserted, strict=True):
            extra = feedback if text is None else encode(text)
            expected += turn_ids + extra
            mask += [1] * len(turn_ids) + [0] * len(extra)
        length = int(out["response_mask"][row].sum())
        assert out["responses"][row, :length].tolist() == expected and out["info_mask"][row, :length].tolist() == mask
    assert "error: division by zero" in tokenizer.decode(out["responses"][2])
    assert out.meta["gen_metrics"]["agent/calls_per_traj"] == pytest.approx(3 / 4)
    texts = [tokenizer.decode(out["responses"][i][out["response_mask"][i].bool()], skip_special_tokens=True)
             for i in range(len(prompts))]
    truth = [ROWS[i]["reward_model"]["ground_truth"] for i in scripts]
    assert [score("calc", t, g) for t, g in zip(texts, truth, strict=True)] == \
        [float(str(a) == g["target"][0]) for a, g in zip((33, 4, None, None), truth, strict=True)]


def memorised_calc_policy(tokenizer, rows: list[dict], out: Path) -> Path:
    """A tiny model (the demo policy's shape) that greedily calls the calculator on each row's problem with the
    right expression, reads the result and answers it. The trajectories are tokenised by the tokenizer as the
    trainer loads it from ``out`` (next to a Qwen2 model's config, it splits digits as Qwen2's does)."""
    torch.manual_seed(0)
    model = build_model(tokenizer)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    examples = []
    for row in rows:
        prompt = render_prompt(tokenizer, row["prompt"])
        target = row["reward_model"]["ground_truth"]["target"][0]
        call = tokenizer(f"<calc> {target} + 0 </calc>", add_special_tokens=False)["input_ids"]
        result = tokenizer(result_text(f"{target} + 0"), add_special_tokens=False)["input_ids"]
        final = tokenizer(f"<answer> {target} </answer>", add_special_tokens=False)["input_ids"]
        examples.append((prompt + call + result + final, [-100] * len(prompt) + call + [-100] * len(result) + final))
    memorise(model, examples)
    model.save_pretrained(out)
    return out


@pytest.mark.slow
def test_grpo_trains_the_calculator_task_through_the_trainer(tokenizer, tmp_path):
    """Two GRPO steps of ``recipe=examples.calculator`` on a tiny policy that memorised calculator trajectories of
    the validation problems: the trainer builds the task's loop from the config, validation (greedy) calls the
    calculator and scores its answers, both steps train, and the run directory holds no search state."""
    ws = tmp_path / "ws"
    ws.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:8]), ws / "train.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[8:]), ws / "val.parquet")
    model = memorised_calc_policy(tokenizer, ROWS[8:], ws / "model")
    out = tmp_path / "run"
    argv = command(ws, [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
                        "trainer.device=cpu", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                        "actor_rollout_ref.actor.optim.lr=1e-4", "trainer.total_training_steps=2",
                        "trainer.test_freq=-1", "trainer.save_freq=2", "trainer.logger=[jsonl]",
                        f"trainer.default_local_dir={out}"])
    assert argv[1:4] == ["-m", "verl.trainer.main_ppo", RECIPE]  # what `python -m examples.calculator` runs
    cfg = load_config(argv[3:])
    trainer = build_trainer(cfg)
    assert "calc     operands up to 20, up to 2 calculator calls" in startup_summary(cfg, trainer)
    trainer.fit()
    records = metrics(out)
    assert [r["step"] for r in records if "actor/pg_loss" in r] == [1, 2]
    assert all("agent/calls_per_traj" in r for r in records if "actor/pg_loss" in r)
    assert trainer.initial_validation["val/em"] == 1.0 and trainer.initial_validation["val/calls"] == 1.0
    validation = [json.loads(line) for line in (out / "validation" / "0.jsonl").read_text().splitlines()]
    assert len(validation) == 4
    for record in validation:
        inserted = [s["text"] for s in record["segments"] if s["kind"] == "inserted"]
        expected = [result_text(f"{record['ground_truth'][0]} + 0")]
        assert inserted == expected and record["score"] == 1.0, json.dumps(record)
    assert "retriever" not in (out / "config.yaml").read_text() and not (out / "retrieval.json").exists()
    assert (out / "global_step_2").is_dir()
