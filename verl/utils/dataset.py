"""Parquet rows (Search-R1 schema) -> tokenised prompt batches, with a resumable position.

Choices: the prompt is rendered once, here (``verl.utils.tokenizer.render_prompt``: the chat template, or plain
text for a base model without one), and prompts travel as token ids (``raw_prompt_ids``) from then on; rows
whose prompt exceeds ``data.max_prompt_length`` are dropped at load time with a logged count and their row
numbers (never silently truncated, which would cut the question); a file in which every prompt is too long is
an error saying how long they are.
Rows are checked when loaded, so bad data fails before any worker starts, with a ``DataError`` that
names the file, the row and the fix: the prompt column and ``reward_model`` must exist, the prompt
must be a non-empty list of chat messages and ``reward_model.ground_truth`` must hold at least one
non-empty answer (an empty one would make every reward 0 without a word).
The loader's position (epoch, next row) is part of every checkpoint, so a resumed run sees exactly
the batches an uninterrupted run would.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from verl.errors import DataError  # noqa: F401 -- raised here, defined below torch
from verl.protocol import Batch
from verl.utils.tokenizer import render_prompt

logger = logging.getLogger(__name__)


SCHEMA_HINT = ("Search-R1 schema: prompt: [{role, content}], reward_model: {ground_truth: {target: [str, ...]}}, "
               "data_source: str (optional), extra_info (optional); see docs/design.md (Parquet row schema) "
               "and data_prep/")




def read_rows(files: str, required: tuple[str, ...] = ()) -> list[dict]:
    """All rows of the comma-separated parquet ``files``, as dicts; every file must have the ``required`` columns."""
    rows: list[dict] = []
    for name in [f.strip() for f in files.split(",") if f.strip()]:
        if not Path(name).exists():
            raise DataError(f"parquet file {name!r} does not exist (data.train_files / data.val_files)")
        try:
            table = pq.read_table(name)
        except Exception as err:  # pyarrow raises several types for a damaged file
            raise DataError(f"{name!r} is not a readable parquet file: {err}") from err
        missing = [c for c in required if c not in table.column_names]
        if missing:
            raise DataError(f"{name!r} lacks the column(s) {missing} (it has {table.column_names}); {SCHEMA_HINT}")
        rows.extend(table.to_pylist())
    if not rows:
        raise DataError(f"no rows in {files!r}: give parquet file(s) with at least one row ({SCHEMA_HINT})")
    return rows


def golden_answers(ground_truth) -> list:
    """The golden answers of a ``reward_model.ground_truth`` value ({"target": [...]}, a list or a string)."""
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth.get("target")
    if isinstance(ground_truth, str):
        return [ground_truth]
    return list(ground_truth) if isinstance(ground_truth, list | tuple | np.ndarray) else []


def check_row(row: dict, prompt_key: str, where: str) -> None:
    """A row's prompt is a non-empty list of chat messages and it has at least one non-empty golden answer."""
    prompt = row[prompt_key]
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in prompt):
        raise DataError(f"{where}: column {prompt_key!r} must be a non-empty list of chat messages "
                        f"{{role, content}}, got {str(prompt)[:120]!r}; {SCHEMA_HINT}")
    reward_model = row["reward_model"]
    answers = golden_answers(reward_model.get("ground_truth") if isinstance(reward_model, dict) else None)
    if not any(isinstance(a, str) and a.strip() for a in answers):
        raise DataError(f"{where}: no golden answer (reward_model.ground_truth = "
                        f"{str(reward_model)[:120]}); every row needs at least one non-empty string in "
                        "reward_model.ground_truth.target: fix or drop the row (data_prep.qa_search.make_row refuses "
                        "such rows)")


class PromptDataset:
    """Tokenised prompts plus the per-row fields the reward needs."""

    def __init__(self, files: str, tokenizer, max_prompt_length: int, prompt_key: str = "prompt",
                 max_samples: int | None = None, sample_seed: int | None = None, tools: list[dict] | None = None):
        """``max_samples`` keeps that many rows: the first ones, or with ``sample_seed`` a random subset drawn
        once with that seed (in file order). ``tools``: JSON schemas the chat template shows (a format with tools)."""
        rows = read_rows(files, required=(prompt_key, "reward_model"))
        if max_samples is not None and max_samples < len(rows):
            keep = np.sort(np.random.default_rng(sample_seed).choice(len(rows), max_samples, replace=False)) \
                if sample_seed is not None else range(max_samples)
            rows = [rows[i] for i in keep]
        self.rows: list[dict] = []
        self.prompt_ids: list[list[int]] = []
        too_long: dict[int, int] = {}  # row -> prompt tokens, for rows over max_prompt_length
        for i, row in enumerate(rows):
            check_row(row, prompt_key, f"row {i} of {files!r}")
            ids = render_prompt(tokenizer, row[prompt_key], tools)
            if len(ids) > max_prompt_length:
                too_long[i] = len(ids)
                continue
            self.rows.append(row)
            self.prompt_ids.append(list(ids))
        if too_long:
            shown = ", ".join(f"row {i}: {n}" for i, n in list(too_long.items())[:5])
            logger.warning("dropped %d of %d rows of %s longer than data.max_prompt_length=%d tokens (%s%s)",
                           len(too_long), len(rows), files, max_prompt_length, shown, ", ..." if len(too_long) > 5
                           else "")
        if not self.rows:
            raise DataError(f"every row of {files!r} is longer than data.max_prompt_length={max_prompt_length} "
                            f"tokens (prompts have {min(too_long.values())} to {max(too_long.values())} tokens); "
                            "raise data.max_prompt_length (and data.max_start_length) or shorten the prompts")

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices: list[int] | np.ndarray) -> Batch:
        """Rows ``indices`` as a Batch of non-tensor columns (``index`` = the row's position in the dataset; ``uid``,
        the group id, is made from it)."""
        rows = [self.rows[i] for i in indices]
        return Batch(non_tensors={
            "raw_prompt_ids": [self.prompt_ids[i] for i in indices],
            "data_source": [r.get("data_source", "unknown") for r in rows],
            "ground_truth": [(r.get("reward_model") or {}).get("ground_truth") for r in rows],
            "extra_info": [r.get("extra_info") for r in rows],
            "index": [int(i) for i in indices],
            "uid": [f"row{i}" for i in indices],
        })


class StatefulLoader:
    """Batches of ``batch_size`` rows, reshuffled per epoch from ``seed``; ``state_dict`` resumes exactly.

    A subclass that groups rows otherwise overrides ``steps`` (and ``batches_per_epoch``); iteration and resume stay
    these (``verl.utils.sft_dataset.TokenBudgetLoader``)."""

    def __init__(self, dataset: PromptDataset, batch_size: int, shuffle: bool, seed: int, drop_last: bool = True):
        if batch_size > len(dataset) and drop_last:
            raise DataError(f"data.train_batch_size={batch_size} is larger than the {len(dataset)} usable rows of "
                            "data.train_files: lower data.train_batch_size or add rows")
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.seed, self.drop_last = seed, drop_last
        self.epoch, self.position = 0, 0  # position = index of the next batch within the epoch

    def batches_per_epoch(self) -> int:
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def steps(self, epoch: int) -> list:
        """The row indices of each batch of ``epoch``, in the order they are yielded."""
        order = np.random.default_rng(self.seed + epoch).permutation(len(self.dataset)) if self.shuffle \
            else np.arange(len(self.dataset))
        return [order[k * self.batch_size:(k + 1) * self.batch_size] for k in range(self.batches_per_epoch())]

    def __iter__(self) -> Iterator[Batch]:
        """Yields the rest of the current epoch, then advances to the next one."""
        steps = self.steps(self.epoch)
        while self.position < len(steps):
            rows = steps[self.position]
            self.position += 1
            yield self.dataset.batch(rows)
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
