"""The learning-rate schedule of ``verl.workers.train_utils.TrainState``: a linear warm-up, then constant or cosine.

The actor, the critic and the SFT trainer choose with ``optim.warmup_style`` (verl's key; its newer spelling
``optim.lr_scheduler_type`` and verl's SFT spelling ``optim.lr_scheduler`` are accepted too). Kept apart from the
optimiser so that the configs can name the allowed schedules (``SCHEDULES``) without importing the workers.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine")  # the learning rate after the warm-up (lr_schedule_factor)


def lr_schedule_factor(step: int, warmup: int, total: int, schedule: str = "constant",
                       min_lr_ratio: float = 0.0) -> float:
    """The learning rate of optimiser step ``step`` (0-based) as a fraction of the configured one.

    ``warmup`` steps rise linearly to 1 (step ``s`` gets ``(s + 1) / warmup``); then ``constant`` stays at 1 and
    ``cosine`` falls along half a cosine from 1 at step ``warmup`` towards ``min_lr_ratio``, which step ``total`` (the
    first after the run) would reach, as transformers' and verl's cosine schedules count; it stays there if the run
    goes on.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"learning-rate schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    done = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * done))
