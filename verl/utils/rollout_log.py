"""``trainer.rollout_data_dir``: every training step's trajectories as ``<dir>/<step>.jsonl`` (verl's key).

One line per trained row: the step, the row's ``uid`` (``row<i>`` = dataset index ``i``), the prompt and response
texts, the score, the stop reason, and the oldest / newest policy version that sampled it (the pipeline's
staleness, ``verl/trainer/pipeline.py``). Written after the step's update, so a file holds exactly what that step
trained on; a resumed run rewrites the files of the steps it redoes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from verl.protocol import Batch

COLUMNS = ("uid", "data_source", "stop_reason", "min_version", "max_version", "num_searches")


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def write_rollouts(directory: str | Path, step: int, batch: Batch, tokenizer) -> Path:
    """Write ``batch``'s rows as ``<directory>/<step>.jsonl`` (atomically: a crash leaves no half file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    prompts = tokenizer.batch_decode(batch["prompts"], skip_special_tokens=True)
    lines = []
    for i in range(len(batch)):
        record = {"step": step, "input": prompts[i], "output": str(batch["response_text"][i]),
                  "score": float(batch["score"][i])}
        record.update({key: _plain(batch[key][i]) for key in COLUMNS if key in batch})
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    path = directory / f"{step}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(lines))
    os.replace(tmp, path)
    return path
