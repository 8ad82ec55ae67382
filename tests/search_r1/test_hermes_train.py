"""One GRPO step in the hermes action format on two Ray ranks, with a user tool registered in this file.

The user's side of the tool registry is one class: ``CalculatorTool`` below (a JSON schema in the tool config, an
async ``call``), registered with ``verl.tools.register_tool`` and named by its class name in a tool config next to
the built-in ``search``. The policy is a tiny model that memorised, for each question, a call of the calculator
ending its turn and then the answer after the tool message (the loop's own insertion ids), so the step's rollouts
really call the tool through the trainer (the agent loop runs in the driver: this process).
"""

from __future__ import annotations

import ast
import json
import operator
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import build_model, train_tokenizer
from search_r1.llm_agent.hermes import ChatFormat
from search_r1.prompts import HERMES_TEMPLATE, make_prompt
from search_r1.tools import SEARCH_SCHEMA
from tests.entry_points import in_process, main_ppo_in_process
from tests.search_r1.memorised_policy import memorise
from verl.config import DEMO_CONFIG
from verl.tools import Tool, ToolCallError, register_tool
from verl.utils.tokenizer import render_prompt
from verl.utils.tracking import read_metrics

pytestmark = pytest.mark.slow  # trains a tiny policy and starts two Ray worker ranks

CALCULATOR_SCHEMA = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression of numbers and + - * /.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
QUESTIONS = {"What is six times seven": ("6 * 7", "42"), "What is one hundred minus one": ("100 - 1", "99")}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@register_tool
class CalculatorTool(Tool):
    """A user tool: arithmetic on numbers, nothing else."""

    calls: list[str] = []  # every expression evaluated in this process (the driver runs the tools)

    async def call(self, arguments: dict) -> str:
        CalculatorTool.calls.append(arguments["expression"])

        def value(node: ast.AST) -> float:
            if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
                return node.value
            if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
                return _OPS[type(node.op)](value(node.left), value(node.right))
            raise ToolCallError("only numbers and + - * / are allowed")

        try:
            result = value(ast.parse(arguments["expression"], mode="eval").body)
        except (SyntaxError, ZeroDivisionError) as err:
            raise ToolCallError(f"cannot evaluate {arguments['expression']!r}: {err}") from None
        return f"{result:g}"


def calculator_call(expression: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}</tool_call>"


@pytest.fixture(scope="module")
def calculator_run(tmp_path_factory) -> Path:
    """A tool config (search + calculator), parquet of QUESTIONS under the hermes prompt, and a tiny policy that
    memorised calculator call -> answer for each."""
    root = tmp_path_factory.mktemp("hermes_train")
    tools = {"tools": [{"class_name": "SearchTool", "config": {}, "tool_schema": SEARCH_SCHEMA},
                       {"class_name": "CalculatorTool", "config": {}, "tool_schema": CALCULATOR_SCHEMA}]}
    (root / "tools.yaml").write_text(json.dumps(tools))  # JSON is YAML
    schemas = [t["tool_schema"] for t in tools["tools"]]
    texts = [make_prompt(q, HERMES_TEMPLATE) for q in QUESTIONS] + [json.dumps(schemas)] * 3 + \
        [calculator_call(e) + f"<answer> {a} </answer> Error: tool_response" for e, a in QUESTIONS.values()] * 3
    trained = train_tokenizer(texts, vocab_size=700)
    torch.manual_seed(0)
    model = build_model(trained, hidden_size=64, intermediate_size=128, num_heads=1)
    model.save_pretrained(root / "model")
    trained.save_pretrained(root / "model")
    # as the trainer loads it: next to a Qwen2 config.json it is a Qwen2Tokenizer, which splits digits
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    chat = ChatFormat(tokenizer, schemas)
    eos = tokenizer.eos_token_id
    examples = []
    for question, (expression, answer) in QUESTIONS.items():
        prompt = render_prompt(tokenizer, [{"role": "user", "content": make_prompt(question, HERMES_TEMPLATE)}],
                               schemas)
        turn = tokenizer(calculator_call(expression), add_special_tokens=False)["input_ids"] + [eos]
        inserted = chat.insertion([{"role": "tool", "content": answer}], tokenizer.decode([eos]))
        final = tokenizer(f"<answer> {answer} </answer>", add_special_tokens=False)["input_ids"]
        labels = [-100] * len(prompt) + turn + [-100] * len(inserted) + final
        examples.append((prompt + turn + inserted + final, labels))
    # unit-scale (frozen) embeddings: the memorised ids then win by margins that survive other thread counts, and
    # sampling at temperature 1 follows them too (as tests/search_r1/model_families.py does)
    torch.nn.init.normal_(model.get_input_embeddings().weight, std=1.0)
    memorise(model, examples, steps=600)
    model.save_pretrained(root / "model")
    rows = [make_row("toy", q, [a], "train", i, template=HERMES_TEMPLATE) for i, (q, (_, a)) in
            enumerate(QUESTIONS.items())]
    rows_to_parquet(rows, root / "train.parquet")
    return root


def test_grpo_step_in_hermes_format_on_two_ranks_calls_a_user_tool(calculator_run, service_url, ray_address,
                                                                    tmp_path):
    """Guards against the hermes format working in the loop but not through the trainer (prompts without the tools,
    the tool config not read, a user tool not found by its class name, tool results trained on, the step failing on
    two ranks): one GRPO step (2 prompts x 2 samples, one HF engine per Ray rank) whose greedy validation
    reproduces the memorised calculator call and answer (EM 1), whose rollouts call the calculator, and whose
    batch holds inserted (masked) tool-message tokens."""
    CalculatorTool.calls.clear()
    out = tmp_path / "run"
    done = main_ppo_in_process(
        "--config", str(DEMO_CONFIG), f"data.train_files={calculator_run / 'train.parquet'}",
        f"data.val_files={calculator_run / 'train.parquet'}",
        f"actor_rollout_ref.model.path={calculator_run / 'model'}",
        "actor_rollout_ref.rollout.name=hf", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.micro_batch_size=1",  # no left padding: greedy follows the memorised ids exactly
        "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.use_kl_in_reward=false",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={calculator_run / 'tools.yaml'}",
        "data.train_batch_size=2", "data.val_batch_size=2", "data.max_prompt_length=1024",
        "data.max_start_length=1024", "data.max_response_length=48", "data.max_trajectory_length=160",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        f"retriever.url={service_url}", "retriever.topk=2", "trainer.backend=ray", "trainer.n_gpus_per_node=2",
        "trainer.device=cpu", "trainer.total_training_steps=1", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=true", "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}",
        ray_address=ray_address)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = read_metrics(out / "metrics.jsonl")
    step = [m for m in metrics if m.get("step") == 1 and "agent/tool_calls_per_traj" in m][-1]
    first = [m for m in metrics if "val/em" in m][0]
    assert first["val/em"] == 1.0, json.dumps(first)  # greedy: the memorised call, the calculator's result, the answer
    assert step["agent/tool_calls_per_traj"] > 0 and step["agent/obs_tokens_per_traj"] > 0
    assert step["agent/tokenization_mismatch"] == 0
    assert {"6 * 7", "100 - 1"} <= set(CalculatorTool.calls)


def test_evaluate_and_infer_run_the_hermes_format(calculator_run, service_url, tmp_path):
    """Guards against evaluation or inference rendering hermes prompts without their tools or running the tag loop:
    search_r1.evaluate with format=hermes and the tool config reproduces the memorised call and answers (EM 1,
    one well-formed tool call per trajectory); search_r1.infer --format hermes shows the tool message as inserted."""
    CalculatorTool.calls.clear()
    hermes = ["actor_rollout_ref.rollout.multi_turn.format=hermes",
              f"actor_rollout_ref.rollout.multi_turn.tool_config_path={calculator_run / 'tools.yaml'}",
              "data.max_prompt_length=1024", "data.max_start_length=1024", "data.max_response_length=48",
              "data.max_trajectory_length=160", "actor_rollout_ref.rollout.micro_batch_size=1"]
    done = in_process("search_r1.evaluate", "--model", calculator_run / "model", "--data",
                      calculator_run / "train.parquet", "--retriever-url", service_url, "--out", tmp_path / "eval",
                      "retriever.topk=2", *hermes)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "eval" / "trajectories.jsonl").read_text().splitlines()]
    assert [(r["em"], r["tool_calls"], r["invalid_calls"]) for r in records] == [(1.0, 1, 0), (1.0, 1, 0)]
    assert sorted(CalculatorTool.calls) == ["100 - 1", "6 * 7"]

    (tmp_path / "hermes.yaml").write_text(json.dumps({"actor_rollout_ref": {"rollout": {"multi_turn": {
        "tool_config_path": str(calculator_run / "tools.yaml")}, "micro_batch_size": 1}},
        "data": {"max_prompt_length": 1024, "max_start_length": 1024}}))
    done = in_process("search_r1.infer", "--model", calculator_run / "model", "--question", "What is six times seven",
                      "--retriever-url", service_url, "--topk", "2", "--format", "hermes", "--config",
                      tmp_path / "hermes.yaml")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "<tool_response>\n42\n</tool_response>" in done.stdout and "answer: '42'" in done.stdout
