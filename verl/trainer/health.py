"""Watching a run's health: non-finite updates, entropy collapse, clip-fraction explosion.

Choices:

* A training step whose update was skipped (a NaN/Inf advantage, loss or gradient norm, see
  ``train_utils``: the weights never see it) is counted; after ``trainer.max_skipped_updates``
  such steps in a row the run stops with ``TrainingStopped``, naming the step, the quantity and the
  last checkpoint saved before the streak began (the one to resume from, or to debug with); the trainer then
  saves the weights as they are, the last finite ones (``PPOTrainer.stop_unhealthy``). It stops the same way once
  more than ``trainer.max_skipped_share`` of the steps this process ran were skipped (from
  ``max_skipped_updates`` skipped steps on), so a run that skips most of its steps, never enough in a row, does not
  train on for ever.
  Skipped are updates with a NaN/Inf advantage, loss or gradient norm, and those that would have left a weight
  NaN/Inf (undone).
* Alarms are warnings, not stops: the policy entropy falling below ``trainer.alarm_entropy_below``
  (collapse, the GRPO failure of Search-R1 #88) or the PPO clip fraction rising above
  ``trainer.alarm_clipfrac_above`` (updates far off-policy) log a console warning and set
  ``health/entropy_collapse`` / ``health/clipfrac_explosion`` to 1 for that step.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl.config import TrainerConfig
from verl.errors import TrainingStopped  # noqa: F401 -- raised here, defined below torch
from verl.utils import checkpoint

logger = logging.getLogger(__name__)

# Metric key -> the quantity a skipped update is blamed on, checked in this order.
NONFINITE_CAUSES = {"actor/nonfinite_advantages": "advantage", "actor/nonfinite_loss": "loss",
                    "actor/nonfinite_grad_norm": "gradient norm", "actor/nonfinite_update": "weight after the update"}


class HealthMonitor:
    def __init__(self, cfg: TrainerConfig, out_dir: Path):
        self.cfg = cfg
        self.out_dir = out_dir
        self.skipped_in_a_row = 0
        self.last_good_step = 0  # the last step whose update went through (0 = none yet)
        self.steps = self.skipped = 0  # steps observed by this process, and those whose update was skipped

    def observe(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Check one step's metrics; returns the ``health/*`` metrics. Raises ``TrainingStopped`` at the limit."""
        cause = next((name for key, name in NONFINITE_CAUSES.items() if metrics.get(key, 0) > 0), None)
        self.steps += 1
        if metrics.get("actor/skipped_updates", 0) > 0:
            self.skipped += 1
            self.skipped_in_a_row += 1
            logger.warning("step %d: %d actor update(s) skipped for a non-finite %s (%d step(s) in a row, limit "
                           "trainer.max_skipped_updates=%d)", step, metrics["actor/skipped_updates"], cause,
                           self.skipped_in_a_row, self.cfg.max_skipped_updates)
        else:
            self.skipped_in_a_row, self.last_good_step = 0, step
        limit, share_limit = self.cfg.max_skipped_updates, self.cfg.max_skipped_share
        in_a_row = self.skipped_in_a_row >= limit
        if in_a_row or (self.skipped >= limit and self.skipped / self.steps > share_limit):
            good = checkpoint.find_latest(self.out_dir, at_most=self.last_good_step)
            why = (f"{self.skipped_in_a_row} steps in a row (trainer.max_skipped_updates={limit})" if in_a_row else
                   f"in {self.skipped} of {self.steps} steps (trainer.max_skipped_share={share_limit:g})")
            raise TrainingStopped(
                f"stopped at step {step}: the actor update was skipped {why} because a {cause} was NaN/Inf; "
                f"last good checkpoint: {good if good is not None else 'none'} (step {self.last_good_step} was the "
                "last with a finite update)")
        entropy, clipfrac = metrics.get("actor/entropy"), metrics.get("actor/pg_clipfrac")
        collapse = entropy is not None and entropy < self.cfg.alarm_entropy_below
        explosion = clipfrac is not None and clipfrac > self.cfg.alarm_clipfrac_above
        if collapse:
            logger.warning("step %d: HEALTH ALARM entropy collapse: actor/entropy=%.4g < trainer.alarm_entropy_below"
                           "=%g", step, entropy, self.cfg.alarm_entropy_below)
        if explosion:
            logger.warning("step %d: HEALTH ALARM clip fraction explosion: actor/pg_clipfrac=%.4g > "
                           "trainer.alarm_clipfrac_above=%g", step, clipfrac, self.cfg.alarm_clipfrac_above)
        return {"health/entropy_collapse": float(collapse), "health/clipfrac_explosion": float(explosion)}
