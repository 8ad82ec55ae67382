"""Parquet rows (Search-R1 schema) -> tokenised prompt batches, with a resumable position.

Choices: the chat template is applied once, here, and prompts travel as token ids
(``raw_prompt_ids``) from then on; rows whose prompt exceeds ``data.max_prompt_length`` are
dropped at load time with a logged count (never silently truncated, which would cut the question).
The loader's position (epoch, next row) is part of every checkpoint, so a resumed run sees exactly
the batches an uninterrupted run would.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from verl.protocol import Batch

logger = logging.getLogger(__name__)


def read_rows(files: str) -> list[dict]:
    """All rows of the comma-separated parquet ``files``, as dicts."""
    rows: list[dict] = []
    for name in [f.strip() for f in files.split(",") if f.strip()]:
        if not Path(name).exists():
            raise FileNotFoundError(f"parquet file {name!r} does not exist (data.train_files / data.val_files)")
        rows.extend(pq.read_table(name).to_pylist())
    if not rows:
        raise ValueError(f"no rows in {files!r}")
    return rows


class PromptDataset:
    """Tokenised prompts plus the per-row fields the reward needs."""

    def __init__(self, files: str, tokenizer, max_prompt_length: int, prompt_key: str = "prompt",
                 max_samples: int | None = None):
        rows = read_rows(files)
        if max_samples is not None:
            rows = rows[:max_samples]
        self.rows: list[dict] = []
        self.prompt_ids: list[list[int]] = []
        dropped = 0
        for i, row in enumerate(rows):
            if prompt_key not in row:
                raise KeyError(f"row {i} of {files!r} has no {prompt_key!r} column (data.prompt_key)")
            ids = tokenizer.apply_chat_template(row[prompt_key], add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "input_ids"):  # transformers may return a BatchEncoding
                ids = ids["input_ids"]
            if len(ids) > max_prompt_length:
                dropped += 1
                continue
            self.rows.append(row)
            self.prompt_ids.append(list(ids))
        if dropped:
            logger.warning("dropped %d of %d rows of %s longer than data.max_prompt_length=%d tokens",
                           dropped, len(rows), files, max_prompt_length)
        if not self.rows:
            raise ValueError(f"every row of {files!r} is longer than data.max_prompt_length={max_prompt_length}")

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices: list[int] | np.ndarray) -> Batch:
        """Rows ``indices`` as a Batch of non-tensor columns (``uid`` = the row's dataset index)."""
        rows = [self.rows[i] for i in indices]
        return Batch(non_tensors={
            "raw_prompt_ids": [self.prompt_ids[i] for i in indices],
            "data_source": [r.get("data_source", "unknown") for r in rows],
            "ground_truth": [(r.get("reward_model") or {}).get("ground_truth") for r in rows],
            "extra_info": [r.get("extra_info") for r in rows],
            "uid": [f"row{i}" for i in indices],
        })


class StatefulLoader:
    """Batches of ``batch_size`` rows, reshuffled per epoch from ``seed``; ``state_dict`` resumes exactly."""

    def __init__(self, dataset: PromptDataset, batch_size: int, shuffle: bool, seed: int, drop_last: bool = True):
        if batch_size > len(dataset) and drop_last:
            raise ValueError(f"data.train_batch_size={batch_size} is larger than the {len(dataset)} usable rows")
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.seed, self.drop_last = seed, drop_last
        self.epoch, self.position = 0, 0  # position = index of the next batch within the epoch

    def batches_per_epoch(self) -> int:
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.dataset))
        return np.random.default_rng(self.seed + self.epoch).permutation(len(self.dataset))

    def __iter__(self) -> Iterator[Batch]:
        """Yields the rest of the current epoch, then advances to the next one."""
        order = self._order()
        while self.position < self.batches_per_epoch():
            idx = order[self.position * self.batch_size:(self.position + 1) * self.batch_size]
            self.position += 1
            yield self.dataset.batch(idx)
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
