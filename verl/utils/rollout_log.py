"""Trajectory records: what the policy saw and did, kept in the run directory (docs/design.md, "Trajectory records").

One JSON object per line, files ``<dir>/<step>.jsonl`` (verl's naming). The trainer keeps, by default, a sample of
every training step's trained rows in ``RUN_DIR/rollouts/`` (``trainer.rollout_data_dir`` replaces the directory,
``trainer.rollout_data_rows`` the sample's size) and every validation's generations in ``RUN_DIR/validation/``
(``trainer.validation_data_dir``, ``trainer.validation_data_rows``); a task's evaluation may write the same record
(for example ``search_r1.evaluate``'s ``trajectories.jsonl``, with ``step`` null, ``split`` "test"). The fields,
which the trajectory viewer reads:

* ``step``, ``split`` ("train" | "val" | "test"), ``uid`` (the trajectory, unique in its file: ``<group>-<k>``, the
  k-th sample of its prompt there), ``group`` (the prompt: the GRPO samples of one prompt share it; a dynamic
  sampling round adds ``#<round>``), ``index`` (the prompt's row in the dataset), ``data_source``;
* ``input`` (the prompt as the policy saw it, chat template included), ``output`` (the whole response text,
  inserted blocks included), ``segments``: the response in order as ``{"kind": "policy" | "inserted", "text",
  "tokens"}``, one per run of equal ``info_mask`` (1 = sampled by the policy, 0 = inserted by the environment),
  each run decoded on its own with its special tokens; the ``tokens`` add up to ``response_length``, and with
  ``actor.state_masking`` (the default) the inserted ones are exactly those that got no gradient;
* ``queries``, ``answer`` (the recipe's: the search queries or tool calls in order, the extracted answer),
  ``ground_truth``, ``score``, ``reward_terms`` ({term: value}), ``advantage`` (the mean over the row's trained
  tokens; null where not computed, as in validation, or where no token was trained), ``stop_reason``,
  ``num_searches``, ``turns``, ``response_length`` (tokens), ``min_version`` / ``max_version`` (the policy versions
  that sampled it, where known).

Choices: a sample keeps whole groups (the samples of one prompt together, so their scores and advantages can be
compared), spread evenly over the batch (``sample_rows``); files are written atomically after the step's update
(a file holds what that step trained on; a resumed run rewrites the steps it redoes).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from verl.protocol import Batch
from verl.utils.dataset import golden_answers

# Per-row columns a recipe's generation may add -> their record field (absent columns are null).
COLUMN_FIELDS = {"data_source": "data_source", "index": "index", "stop_reason": "stop_reason",
                 "num_searches": "num_searches", "num_turns": "turns", "min_version": "min_version",
                 "max_version": "max_version"}


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def segments(token_ids: Sequence[int], info_mask: Sequence[int], tokenizer) -> list[dict]:
    """The response ``token_ids`` (real tokens only) as runs of equal ``info_mask`` (1 = sampled by the policy,
    0 = inserted by the environment): ``[{"kind": "policy" | "inserted", "text": str, "tokens": int}, ...]``."""
    out: list[dict] = []
    start = 0
    for end in range(1, len(token_ids) + 1):
        if end == len(token_ids) or info_mask[end] != info_mask[start]:
            text = tokenizer.decode(list(token_ids[start:end]), skip_special_tokens=False)
            out.append({"kind": "policy" if info_mask[start] else "inserted", "text": text, "tokens": end - start})
            start = end
    return out


def sample_rows(groups: Sequence[str], cap: int) -> list[int]:
    """Indices of at most ``cap`` rows of a batch whose rows belong to ``groups`` (a group id per row): whole groups,
    spread evenly over the batch (every row when they fit; the first ``cap`` rows of one group when a group is
    larger than ``cap``), in batch order."""
    if len(groups) <= cap:
        return list(range(len(groups)))
    if cap <= 0:
        return []
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    order = list(members)
    keep = max(1, cap // max(len(m) for m in members.values()))  # groups that fit
    picked = {order[int(j)] for j in np.linspace(0, len(order) - 1, num=min(keep, len(order))).round()}
    return sorted(i for group in picked for i in members[group])[:cap]


def trajectory_records(batch: Batch, tokenizer, step: int | None, split: str, rows: Sequence[int],
                       extra: dict[str, Sequence] | None = None) -> list[dict]:
    """The records (module docstring) of ``batch``'s ``rows`` (a scored batch: prompts [B, P], responses,
    response_mask, info_mask [B, R], score, response_text; advantages and loss_mask [B, R] when trained).
    ``extra``: the recipe's fields, one value per row of the batch (``Recipe.trajectory_fields``)."""
    extra = extra or {}
    prompt_len = batch["prompts"].shape[1]
    terms = [key for key in batch.keys() if key.startswith("reward/")]
    seen: Counter[str] = Counter()
    records = []
    for i in rows:
        real = batch["response_mask"][i].bool()  # [R]: the response's tokens, not its padding
        ids, info = batch["responses"][i][real].tolist(), batch["info_mask"][i][real].tolist()
        prompt = batch["prompts"][i][batch["attention_mask"][i, :prompt_len].bool()].tolist()  # left padding off
        group = str(batch["uid"][i])
        record = {"step": step, "split": split, "uid": f"{group}-{seen[group]}", "group": group,
                  **{name: None for name in COLUMN_FIELDS.values()},
                  **{name: _plain(batch[key][i]) for key, name in COLUMN_FIELDS.items() if key in batch},
                  "input": tokenizer.decode(prompt, skip_special_tokens=False),
                  "output": str(batch["response_text"][i]), "segments": segments(ids, info, tokenizer),
                  "queries": [], "answer": None, **{name: _plain(values[i]) for name, values in extra.items()},
                  "ground_truth": [str(a) for a in golden_answers(batch["ground_truth"][i])],
                  "score": float(batch["score"][i]),
                  "reward_terms": {key.removeprefix("reward/"): float(batch[key][i]) for key in terms},
                  "advantage": _mean_advantage(batch, i), "response_length": len(ids)}
        for key in ("min_version", "max_version"):  # -1: no engine reported the version
            record[key] = None if record[key] == -1 else record[key]
        seen[group] += 1
        records.append(record)
    return records


def _mean_advantage(batch: Batch, i: int) -> float | None:
    """The mean advantage over row ``i``'s trained tokens (loss_mask 1); None when not computed or none trained."""
    if "advantages" not in batch:
        return None
    trained = batch["loss_mask"][i].bool()  # [R]
    return float(batch["advantages"][i][trained].mean()) if trained.any() else None


def write_records(directory: str | Path, step: int, records: list[dict]) -> Path:
    """``records`` as ``<directory>/<step>.jsonl``, atomically (a crash leaves no half file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{step}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
    os.replace(tmp, path)
    return path


class TrajectoryLog:
    """Where and how much of a run's trajectories are kept: a sample of each training step's trained rows
    (``trainer.rollout_data_dir`` / ``rollout_data_rows``) and of each validation's generations
    (``trainer.validation_data_dir`` / ``validation_data_rows``), by default in the run directory's ``rollouts/``
    and ``validation/``. ``fields``: the recipe's per-row fields (``Recipe.trajectory_fields``)."""

    def __init__(self, trainer_cfg, run_dir: Path, tokenizer, fields=None):
        t = trainer_cfg
        self.train_dir, self.train_rows = Path(t.rollout_data_dir or run_dir / "rollouts"), t.rollout_data_rows
        self.val_dir, self.val_rows = Path(t.validation_data_dir or run_dir / "validation"), t.validation_data_rows
        self.tokenizer, self.fields = tokenizer, fields

    def records(self, batch: Batch, step: int, split: str, rows: Sequence[int]) -> list[dict]:
        """The records of ``batch``'s ``rows`` (``trajectory_records`` with the recipe's fields)."""
        if not rows:
            return []
        return trajectory_records(batch, self.tokenizer, step, split, rows,
                                  self.fields(batch) if self.fields is not None else None)

    def keep_trained(self, step: int, batch: Batch) -> list[dict]:
        """The records of every row of the step's trained ``batch`` (what the health alarms read); a sample of them
        (whole groups of its ``uid``) is written as ``<train dir>/<step>.jsonl``."""
        records = self.records(batch, step, "train", range(len(batch)))
        kept = sample_rows([record["group"] for record in records], self.train_rows)
        if kept:
            write_records(self.train_dir, step, [records[i] for i in kept])
        return records

    def validation_sample(self, prompts: int, n: int) -> set[int]:
        """The dataset rows (of ``prompts``, each generated ``n`` times) whose generations a validation keeps."""
        groups = [str(row) for row in range(prompts) for _ in range(n)]
        return {int(groups[i]) for i in sample_rows(groups, self.val_rows)}

    def keep_validation(self, step: int, records: list[dict]) -> None:
        """A validation's kept records as ``<validation dir>/<step>.jsonl``."""
        if records:
            write_records(self.val_dir, step, records)
