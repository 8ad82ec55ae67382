"""Answer one question with a policy and the search loop, printing the trajectory.

    python -m search_r1.infer --model data/demo/tiny_policy --question "Who founded the Guild of X?"

Runs exactly the training loop (``llm_agent.generation.search_agent``) for one row: the prompt is
``search_r1.prompts.make_prompt`` under the model's chat template (``--format hermes``: the hermes template, the
tools' schemas in the chat template), and the loop is built as the
evaluation builds it (``search_r1.evaluate.build_agent``: the trainer's ``build_rollout``, lengths
from ``configs/ppo_trainer.yaml``). The printout
shows the policy's text and, marked, every block the environment inserted (info_mask 0). Exit status 2 with
``error: <message>`` for a bad argument, model directory or retriever URL; 1 for a retrieval failure mid-loop.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from itertools import groupby

from search_r1.evaluate import EvalInputError, agent_config, build_agent, check_model_dir
from search_r1.llm_agent.generation import SearchTrajectory
from search_r1.prompts import TEMPLATES, make_prompt
from search_r1.reward.qa_em import extract_answer
from search_r1.search.client import RetrievalError
from verl.config import ConfigError
from verl.tools import run_tool_specs
from verl.utils.tokenizer import render_prompt
from verl.workers.rollout.base import SamplingParams

INSERTED_OPEN = "\n[[inserted by the environment >>>"
INSERTED_CLOSE = "<<< end of inserted]]\n"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory (weights + tokenizer)")
    p.add_argument("--question", required=True)
    p.add_argument("--retriever-url", default="http://127.0.0.1:8000", help="base URL of the retrieval service")
    p.add_argument("--topk", type=int, default=3, help="passages per search")
    p.add_argument("--max-turns", type=int, default=3, help="search turns before the final answer turn")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--format", choices=["search_r1", "hermes"], default="search_r1",
                   help="action format (actor_rollout_ref.rollout.multi_turn.format): tags or chat-template tool calls")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ray-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="--retriever-url ray://NAME: give up joining the Ray cluster after this many seconds")
    p.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="YAML layered over configs/ppo_trainer.yaml, as in training (e.g. configs/demo.yaml)")
    args = p.parse_args(argv)
    if not args.question.strip():
        p.error("--question is empty: give the question to answer")
    if not 0 <= args.temperature <= 10:  # also refuses nan and inf
        p.error(f"--temperature must be in [0, 10] (0 = greedy), got {args.temperature}")
    if not 0 < args.ray_timeout < float("inf"):
        p.error(f"--ray-timeout must be a positive number of seconds, got {args.ray_timeout}")
    return args


def render(tokenizer, traj: SearchTrajectory) -> str:
    """The response as text; each run of inserted tokens (info_mask 0) is wrapped in visible markers."""
    parts = []
    pos = 0
    for sampled, run in groupby(traj.info_mask):
        n = len(list(run))
        text = tokenizer.decode(traj.response_ids[pos:pos + n], skip_special_tokens=True)
        parts.append(text if sampled else INSERTED_OPEN + text + INSERTED_CLOSE)
        pos += n
    return "".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = agent_config(args.model, args.engine, args.retriever_url, args.seed,
                           [f"retriever.topk={args.topk}", f"max_turns={args.max_turns}",
                            f"trainer.ray_timeout_s={args.ray_timeout}",
                            f"actor_rollout_ref.rollout.multi_turn.format={args.format}"], args.config)
        check_model_dir(args.model)
        from transformers import AutoTokenizer  # heavy import

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        action_format = cfg.actor_rollout_ref.rollout.multi_turn.format
        messages = [{"role": "user", "content": make_prompt(args.question, TEMPLATES[action_format])}]
        tools = [spec.schema for spec in run_tool_specs(cfg) or []]  # shown in the prompt (hermes format)
        prompt_ids = render_prompt(tokenizer, messages, tools)
        if len(prompt_ids) > cfg.data.max_prompt_length:  # the loop refuses it (training drops such rows)
            raise EvalInputError(f"--question of {len(args.question):,} characters makes a prompt of "
                                 f"{len(prompt_ids):,} tokens; allowed at most data.max_prompt_length="
                                 f"{cfg.data.max_prompt_length} (a shorter question, or a larger "
                                 "data.max_prompt_length in a --config file)")
        agent = build_agent(cfg, tokenizer)
    except (ConfigError, EvalInputError) as err:  # bad arguments, model directory, question or retriever URL
        print(f"error: {err}", file=sys.stderr)
        return 2
    params = SamplingParams(max_tokens=cfg.data.max_response_length, temperature=args.temperature, seed=args.seed)
    try:
        traj = agent.run([list(prompt_ids)], params).trajectories[0]
    except RetrievalError as err:  # the service failed during the loop
        print(f"error: {err}", file=sys.stderr)
        return 1

    print(tokenizer.decode(traj.prompt_ids, skip_special_tokens=False), end="")
    print(render(tokenizer, traj))
    answer = extract_answer(tokenizer.decode(traj.response_ids, skip_special_tokens=True))
    print(f"\n--- stop: {traj.stop_reason.value} | turns: {traj.num_turns} | searches: {traj.num_searches} | "
          f"invalid actions: {traj.num_invalid} | response tokens: {len(traj.response_ids)} "
          f"({len(traj.info_mask) - sum(traj.info_mask)} inserted) | answer: {answer!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
