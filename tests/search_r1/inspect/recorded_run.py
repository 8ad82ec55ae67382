"""A run directory of real trajectories for the viewer's tests, written in the trajectory record format
(``search_r1/inspect/records.py``) from real batches, until the trainer writes it itself.

Each batch goes through the trainer's own phases: the prompts of a real parquet (``PromptDataset``), the search
loop over the memorised tiny policy on an HF engine and the real retrieval service (``search_agent``),
``loss_mask``, the reward (``RewardManager`` with the search recipe's score and reward terms) and the advantages
(``token_rewards``, ``compute_advantages``, REINFORCE++: the samples of a prompt here often score alike, and GRPO would
make every advantage 0). ``records_from_batch`` then writes each row as the record contract says:
``segments`` are the runs of the row's ``info_mask`` (0 = inserted, decoded on its own), the advantage the mean
over the row's trained tokens. The same batches are also written as ``trainer.rollout_data_dir`` wrote them before
the record contract (``write_legacy_rollouts``: step, input, output, score and a few columns), so the tests can show
both vintages of one run.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from data_prep.qa_search import make_row, rows_to_parquet
from search_r1.llm_agent.generation import AgentLoop
from search_r1.reward.qa_em import compute_score, extract_answer, ground_truth_answers
from search_r1.reward.terms import TermsReward, trajectories
from search_r1.search.client import RetrievalClient
from tests.search_r1.agent_settings import make_agent, search_config
from tests.search_r1.memorised_policy import QUESTIONS, TOPK
from verl.config import load_config
from verl.protocol import Batch
from verl.trainer import columns
from verl.trainer.reward import RewardManager, compute_advantages, token_rewards
from verl.utils.dataset import PromptDataset
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

FRANCE, JAPAN = QUESTIONS  # the memorised policy answers "Paris" and "Japan"
# (question, gold answers): the policy answers rows 0 and 1 right and row 2 wrong (its answer is "Japan")
ROWS = [(FRANCE, ["Paris"]), (JAPAN, ["Japan"]), (JAPAN, ["Tokyo"])]
SAMPLES = 2  # per prompt in training


@dataclass
class RecordedStep:
    step: int
    split: str
    batch: Batch  # the scored batch with its advantages
    records: list[dict]  # the lines written


def runs_of(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """(mask value, ids) of each maximal run of equal mask values, in order."""
    runs: list[tuple[int, list[int]]] = []
    for token, m in zip(ids, mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(token)
        else:
            runs.append((m, [token]))
    return runs


def response_of(batch: Batch, i: int) -> tuple[list[int], list[int]]:
    """Row ``i``'s response ids and info mask without padding."""
    n = int(batch["response_mask"][i].sum())
    return batch["responses"][i, :n].tolist(), batch["info_mask"][i, :n].tolist()


def records_from_batch(batch: Batch, tokenizer, step: int, split: str) -> list[dict]:
    """The trajectory records of a scored batch (one per row)."""
    prompts = tokenizer.batch_decode(batch["prompts"], skip_special_tokens=True)
    turns = trajectories(batch, tokenizer, list(batch["response_text"]))
    mask = batch["loss_mask"].float()  # [B, R]
    advantage = (batch["advantages"] * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    terms = {name: batch[name] for name in batch.non_tensors if name.startswith("reward/")}
    records, seen = [], {}
    for i in range(len(batch)):
        ids, info = response_of(batch, i)
        group = str(batch["uid"][i])
        seen[group] = seen.get(group, -1) + 1
        text = str(batch["response_text"][i])
        records.append({
            "step": step, "split": split, "uid": f"{group}/{seen[group]}", "group": group,
            "index": int(batch["extra_info"][i]["index"]), "data_source": str(batch["data_source"][i]),
            "input": prompts[i], "output": text,
            "segments": [{"kind": "policy" if m else "inserted", "text": tokenizer.decode(run), "tokens": len(run)}
                         for m, run in runs_of(ids, info)],
            "queries": [t.query for t in turns[i].turns if t.query is not None],
            "answer": extract_answer(text), "ground_truth": ground_truth_answers(batch["ground_truth"][i]),
            "score": float(batch["score"][i]),
            "reward_terms": {name.removeprefix("reward/"): float(v[i]) for name, v in terms.items()},
            "advantage": None if split != "train" else float(advantage[i]),
            "stop_reason": str(batch["stop_reason"][i]), "num_searches": int(batch["num_searches"][i]),
            "turns": int(batch["num_turns"][i]), "response_length": len(ids),
            "min_version": int(batch["min_version"][i]), "max_version": int(batch["max_version"][i])})
    return records


LEGACY_COLUMNS = ("uid", "data_source", "stop_reason", "min_version", "max_version", "num_searches")


def write_legacy_rollouts(directory: Path, step: int, batch: Batch, tokenizer) -> None:
    """``<directory>/<step>.jsonl`` as the trainer wrote ``trainer.rollout_data_dir`` before the record contract
    (files that users' older runs hold): one line per row, the prompt and response texts, the score and
    ``LEGACY_COLUMNS``."""
    directory.mkdir(parents=True, exist_ok=True)
    prompts = tokenizer.batch_decode(batch["prompts"], skip_special_tokens=True)
    lines = []
    for i in range(len(batch)):
        record = {"step": step, "input": prompts[i], "output": str(batch["response_text"][i]),
                  "score": float(batch["score"][i])}
        record.update({key: batch[key][i].item() if hasattr(batch[key][i], "item") else batch[key][i]
                       for key in LEGACY_COLUMNS if key in batch})
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    (directory / f"{step}.jsonl").write_text("".join(lines))


def scored_batch(agent: AgentLoop, dataset: PromptDataset, tokenizer, samples: int,
                 temperature: float) -> Batch:
    """Every row of ``dataset``, ``samples`` times, through the trainer's generate, reward and advantage phases."""
    params = SamplingParams(max_tokens=1, temperature=temperature, seed=1)  # max_tokens: the loop sets each turn's
    out = agent(dataset.batch(list(range(len(dataset)))).repeat(samples), params)
    out = columns.write(out, "loss_mask", loss_mask=out["response_mask"] * out["info_mask"])  # [B, R]
    score = functools.partial(compute_score, default_scorer="em", format_score=0.0, normalize="squad")
    out = RewardManager(tokenizer, score, TermsReward(None, None, "squad")).score_batch(out)
    cfg = load_config(["algorithm.adv_estimator=reinforce_plus_plus"])  # whitened over the batch: not all 0
    out, _ = token_rewards(out, cfg, kl_ctrl=None)
    out = compute_advantages(out, cfg)
    return out


def write_run(run_dir: Path, model_dir: Path, tokenizer, service_url: str) -> list[RecordedStep]:
    """``run_dir`` with ``rollouts/1.jsonl`` (sampled at temperature 1: the tiny policy mostly rambles, some rows
    get invalid-action feedback or passages), ``rollouts/2.jsonl`` (greedy: the memorised searches and answers) and
    ``validation/2.jsonl`` (greedy, one sample per row), and the same training batches in today's format under
    ``rollout_data_dir/``. Returns what was written."""
    rows = [make_row("toy", q, gold, "test", i) for i, (q, gold) in enumerate(ROWS)]
    rows_to_parquet(rows, run_dir / "data.parquet")
    dataset = PromptDataset(str(run_dir / "data.parquet"), tokenizer, max_prompt_length=512)
    engine = HFRollout(str(model_dir), dtype="float32", device="cpu", micro_batch_size=64, seed=0)
    client = RetrievalClient(service_url, TOPK)

    cfg = search_config(max_turns=3, max_start_length=256, max_prompt_length=576, max_response_length=320,
                        max_trajectory_length=320, max_obs_length=96, do_search=True, topk=TOPK)
    agent = make_agent(tokenizer, engine, client, cfg)
    steps = []
    for step, split, temperature, samples in ((1, "train", 1.0, SAMPLES), (2, "train", 0.0, SAMPLES),
                                              (2, "val", 0.0, 1)):
        with torch.no_grad():
            batch = scored_batch(agent, dataset, tokenizer, samples, temperature)
        records = records_from_batch(batch, tokenizer, step, split)
        directory = run_dir / ("rollouts" if split == "train" else "validation")
        directory.mkdir(exist_ok=True)
        (directory / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        if split == "train":
            write_legacy_rollouts(run_dir / "rollout_data_dir", step, batch, tokenizer)
        steps.append(RecordedStep(step, split, batch, records))
    return steps
