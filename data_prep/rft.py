"""Rejection-sampled rollouts of a policy (RFT) as cold-start trajectories: ``python -m data_prep.cold_start rft``.

    python -m data_prep.cold_start rft --model DIR --data train.parquet --retriever-url URL --out sft.parquet \\
        [--n 4 --temperature 1.0] [--config configs/demo.yaml] [key=value ...]

Each question is rolled out ``--n`` times by the training loop itself (``search_r1.evaluate.build_agent``: the
engine ``build_rollout`` makes from the config, the search agent loop, the retrieval service), and a trajectory
is kept only when it ended with an answer (``StopReason.ANSWERED``) that is an exact match of a gold answer under
``reward.normalize`` (``qa_em.em_check``, the reward's own check). Identical kept trajectories of one question are
kept once. A kept trajectory's turns are its runs of sampled and of inserted ids, each decoded as it is (special
tokens included), so the SFT data hold what the loop produced; the SFT dataset tokenises them again.
Settings are the training config's (``configs/ppo_trainer.yaml``, ``--config`` layers, ``key=value``), as
``search_r1.evaluate`` reads them.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from data_prep.sft_rows import qa_fields, sft_row
from search_r1.evaluate import EvalInputError, agent_config, build_agent, check_model_dir
from search_r1.llm_agent.search_env import SearchTrajectory
from search_r1.reward.qa_em import em_check, extract_answer, ground_truth_answers
from verl.agent.trajectory import StopReason
from verl.utils.progress import progress
from verl.workers.rollout.base import SamplingParams


def add_rft_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the policy to sample (a Hugging Face model directory)")
    parser.add_argument("--n", type=int, default=4, help="rollouts per question")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the rollouts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64, help="trajectories per loop call")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="YAML layered over configs/ppo_trainer.yaml, as in training (e.g. configs/demo.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (configs/ppo_trainer.yaml)")


def turns_of(tokenizer, traj: SearchTrajectory) -> list[dict]:
    """The trajectory's response as SFT turns: each run of sampled ids (``sampled``) and of inserted ids, decoded."""
    turns: list[dict] = []
    start = 0
    for end in range(1, len(traj.info_mask) + 1):
        if end == len(traj.info_mask) or traj.info_mask[end] != traj.info_mask[start]:
            text = tokenizer.decode(traj.response_ids[start:end], skip_special_tokens=False)
            turns.append({"text": text, "sampled": bool(traj.info_mask[start])})
            start = end
    return turns


def judge(tokenizer, traj: SearchTrajectory, golds: list[str], normalize: str) -> str:
    """Why a rollout is kept or dropped: exact_match | not answered (<stop reason>) | wrong answer."""
    if traj.stop_reason is not StopReason.ANSWERED:
        return f"not answered ({traj.stop_reason.value})"
    answer = extract_answer(tokenizer.decode(traj.response_ids, skip_special_tokens=True))
    return "exact_match" if answer is not None and em_check(answer, golds, normalize) == 1.0 else "wrong answer"


def rft_cold_start(args: argparse.Namespace) -> tuple[list[dict], Counter]:
    """SFT rows of the exact-match rollouts of ``args.model`` over ``args.data`` -> (rows kept, outcome counts)."""
    for f in args.config:
        if not Path(f).is_file():
            raise EvalInputError(f"--config {f!r}: no such file (a YAML of keys layered over configs/ppo_trainer.yaml)")
    if args.n < 1 or not 0 < args.temperature <= 10:
        raise EvalInputError(f"--n must be >= 1 and --temperature in (0, 10], got {args.n} and {args.temperature}")
    check_model_dir(args.model)
    cfg = agent_config(args.model, "hf", args.retriever_url, args.seed,
                       [f"retriever.topk={args.topk}", *args.overrides], args.config)
    from transformers import AutoTokenizer

    from verl.tools import run_tool_specs
    from verl.utils.dataset import PromptDataset

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tools = [spec.schema for spec in run_tool_specs(cfg) or []] or None  # the hermes format's prompts show them
    dataset = PromptDataset(args.data, tokenizer, cfg.data.max_prompt_length, cfg.data.prompt_key, tools=tools)
    agent = build_agent(cfg, tokenizer)
    items = [(row, sample) for row in range(len(dataset)) for sample in range(args.n)]
    counts: Counter = Counter()
    kept: dict[int, list[list[dict]]] = {}
    with progress(total=len(items), unit="traj", desc="rft") as bar:
        for start in range(0, len(items), args.batch_size):
            batch = items[start:start + args.batch_size]
            params = SamplingParams(max_tokens=agent.data.max_response_length, temperature=args.temperature,
                                    seed=args.seed + start)
            result = agent.run([dataset.prompt_ids[row] for row, _ in batch], params)
            for (row, _), traj in zip(batch, result.trajectories, strict=True):
                golds = ground_truth_answers(dataset.rows[row]["reward_model"]["ground_truth"])
                outcome = judge(tokenizer, traj, golds, cfg.reward.normalize)
                turns = turns_of(tokenizer, traj)
                if outcome == "exact_match" and turns in kept.get(row, []):
                    outcome = "duplicate"
                if outcome == "exact_match":
                    kept.setdefault(row, []).append(turns)
                counts[outcome] += 1
            bar.update(len(batch))
    rows = [sft_row(qa_fields(dataset.rows[row], row), turns, tools) for row in sorted(kept) for turns in kept[row]]
    return rows, counts
