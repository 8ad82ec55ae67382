"""Checkpoint directories: ``<default_local_dir>/global_step_<N>/`` written atomically.

Layout of one checkpoint:

    global_step_N/actor/        written by the actor workers (model, optimizer, scheduler)
    global_step_N/critic/       written by the critic workers (when there is a critic)
    global_step_N/trainer.pt    step, dataloader position, KL controller, Python/NumPy/torch RNG states
    global_step_N/config.yaml   the resolved config of the run

Choices: everything is written into ``global_step_N.tmp`` and renamed at the end, and
``latest_checkpointed_iteration.txt`` is updated last, so a crash while saving never leaves a
checkpoint that ``resume_mode=auto`` would pick up half-written.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch

LATEST = "latest_checkpointed_iteration.txt"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def find_latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    marker = Path(root) / LATEST
    if not marker.exists():
        return None
    path = step_dir(root, int(marker.read_text().strip()))
    return path if (path / "trainer.pt").exists() else None


def begin(root: str | Path, step: int) -> Path:
    """A fresh temporary directory to write step ``step``'s checkpoint into."""
    tmp = Path(root) / f"global_step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(root: str | Path, tmp: Path, step: int, trainer_state: dict, config_yaml: str) -> Path:
    """Write the trainer state, move ``tmp`` into place and mark it the latest checkpoint."""
    state = {**trainer_state, "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                                      "torch": torch.get_rng_state()}}
    torch.save(state, tmp / "trainer.pt")
    (tmp / "config.yaml").write_text(config_yaml)
    final = step_dir(root, step)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    marker = Path(root) / LATEST
    marker.with_suffix(".tmp").write_text(str(step))
    marker.with_suffix(".tmp").rename(marker)
    return final


def load_trainer_state(path: str | Path) -> dict:
    """Read ``trainer.pt`` of a checkpoint and restore the RNG states it saved."""
    state = torch.load(Path(path) / "trainer.pt", weights_only=False)
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return state
