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
* Alarms are warnings, not stops, each calibrated to the run it watches and each saying what to do. An
  ``Alarm`` watches one metric, logs a console warning when it fires and sets ``health/<name>`` to 1 for that
  step (0 otherwise); a resumed run gives it the steps already logged (``HealthMonitor.restore``), so a state such
  as a baseline survives the resume. A new monitor is one more ``Alarm`` in ``HealthMonitor.alarms``, its
  thresholds settings of ``trainer``.

  - ``EntropyCollapse``: the policy entropy falling below ``trainer.alarm_entropy_fraction`` of the run's own
    starting entropy (the mean of its first ``trainer.alarm_baseline_steps`` steps), the GRPO failure of
    Search-R1 #88. Relative, because where a run starts is its own: right after a supervised cold start the policy
    is sharp (0.03 nats a token in issue 57's run), which is no collapse, while a run from a base model starts
    near 1. ``trainer.alarm_entropy_below`` adds an absolute floor (off by default).
  - ``ClipFractionExplosion``: the PPO clip fraction above ``trainer.alarm_clipfrac_above`` (updates far
    off-policy). Absolute: every run starts at 0 (one update on the batch's own policy clips nothing).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from verl.config import TrainerConfig
from verl.errors import TrainingStopped  # noqa: F401 -- raised here, defined below torch
from verl.utils import checkpoint

logger = logging.getLogger(__name__)

# Metric key -> the quantity a skipped update is blamed on, checked in this order.
NONFINITE_CAUSES = {"actor/nonfinite_advantages": "advantage", "actor/nonfinite_loss": "loss",
                    "actor/nonfinite_grad_norm": "gradient norm", "actor/nonfinite_update": "weight after the update"}


class Alarm(Protocol):
    """A watched metric: ``observe`` returns the warning when it fires on a step (what happened and what to do)."""

    name: str  # logged as health/<name>: 1 on a step it fired, else 0

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        """The warning for this step's ``metrics``, or None."""
        ...

    def restore(self, step: int, metrics: dict[str, float]) -> None:
        """Take a step that a resumed run logged before (its state only: no warning)."""
        ...


class EntropyCollapse:
    """``actor/entropy`` below ``fraction`` x the run's starting entropy (the mean over its first ``baseline_steps``
    steps; not checked before), or below ``floor`` (any step; None = no floor)."""

    name = "entropy_collapse"
    ADVICE = ("the policy has stopped exploring (GRPO groups whose samples agree carry no signal). What to do: lower "
              "actor_rollout_ref.actor.optim.lr, add an entropy bonus (actor_rollout_ref.actor.entropy_coeff) or a KL "
              "loss (actor_rollout_ref.actor.use_kl_loss=true, kl_loss_coef), and resume from a checkpoint before the "
              "fall")

    def __init__(self, fraction: float, baseline_steps: int, floor: float | None):
        self.fraction, self.baseline_steps, self.floor = fraction, baseline_steps, floor
        self.first: list[float] = []  # the entropies of the run's first steps (its baseline once complete)

    def restore(self, step: int, metrics: dict[str, float]) -> None:
        entropy = metrics.get("actor/entropy")
        if entropy is not None and len(self.first) < self.baseline_steps:
            self.first.append(entropy)

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        entropy = metrics.get("actor/entropy")
        if entropy is None:  # no update ran this step
            return None
        baseline = sum(self.first) / len(self.first) if len(self.first) == self.baseline_steps else None
        self.restore(step, metrics)
        if self.floor is not None and entropy < self.floor:
            return (f"actor/entropy={entropy:.4g} < trainer.alarm_entropy_below={self.floor:g}: {self.ADVICE}")
        if baseline is not None and entropy < self.fraction * baseline:
            return (f"actor/entropy={entropy:.4g} is below {self.fraction:g} x the run's starting entropy "
                    f"{baseline:.4g} (the mean of its first {self.baseline_steps} step(s); "
                    f"trainer.alarm_entropy_fraction): {self.ADVICE}")
        return None


class ClipFractionExplosion:
    """``actor/pg_clipfrac`` above ``limit``."""

    name = "clipfrac_explosion"

    def __init__(self, limit: float):
        self.limit = limit

    def restore(self, step: int, metrics: dict[str, float]) -> None:
        pass  # no state

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        clipfrac = metrics.get("actor/pg_clipfrac")
        if clipfrac is None or clipfrac <= self.limit:
            return None
        return (f"actor/pg_clipfrac={clipfrac:.4g} > trainer.alarm_clipfrac_above={self.limit:g}: the updates move "
                "the policy far from the one that sampled the batch. What to do: lower "
                "actor_rollout_ref.actor.optim.lr, use fewer actor_rollout_ref.actor.ppo_epochs or a larger "
                "ppo_mini_batch_size; with trainer.max_staleness > 0, lower it")


class HealthMonitor:
    def __init__(self, cfg: TrainerConfig, out_dir: Path):
        self.cfg = cfg
        self.out_dir = out_dir
        self.skipped_in_a_row = 0
        self.last_good_step = 0  # the last step whose update went through (0 = none yet)
        self.steps = self.skipped = 0  # steps observed by this process, and those whose update was skipped
        self.alarms: list[Alarm] = [
            EntropyCollapse(cfg.alarm_entropy_fraction, cfg.alarm_baseline_steps, cfg.alarm_entropy_below),
            ClipFractionExplosion(cfg.alarm_clipfrac_above)]

    def restore(self, records: list[dict]) -> None:
        """The steps a resumed run already logged (``metrics.jsonl``'s records, in order), for the alarms' state."""
        for record in records:
            if record.get("step", 0) > 0:
                for alarm in self.alarms:
                    alarm.restore(record["step"], record)

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
        health = {}
        for alarm in self.alarms:
            warning = alarm.observe(step, metrics)
            if warning is not None:
                logger.warning("step %d: HEALTH ALARM %s: %s", step, alarm.name.replace("_", " "), warning)
            health[f"health/{alarm.name}"] = float(warning is not None)
        return health
