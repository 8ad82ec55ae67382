"""Watching a run's health: non-finite updates stop it; the alarms catch collapse and reward hacking.

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
* Alarms (``alarms.py``: one ``Alarm`` per monitor, thresholds settings of ``trainer``; a task adds its own through
  the recipe module's ``alarms(cfg)``) watch for collapse and reward hacking. Each logs ``health/<name>`` every step
  (1 on a step it fired) and its own ``monitor/*`` values, and warns once, the first time it fires, in one line
  naming the step and an example trajectory (``HEALTH ALARM <name> at step N (example trajectory UID): ...``). An
  alarm that ``trainer.stop_on`` names also stops the run after that step is logged and saved (exit 3; the same
  command resumes from that checkpoint). A resumed run gives the alarms the steps already logged
  (``HealthMonitor.restore``), so their baselines survive, and an alarm that fired before does not warn again.
  ``trainer.stop_on`` is checked against the alarms' names when the trainer is built, before anything is written.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from verl.config import Config, TrainerConfig
from verl.errors import ConfigError, TrainingStopped
from verl.trainer.alarms import Alarm, Row, generic_alarms
from verl.trainer.recipe import recipe_alarms
from verl.utils import checkpoint

logger = logging.getLogger(__name__)

# Metric key -> the quantity a skipped update is blamed on, checked in this order.
NONFINITE_CAUSES = {"actor/nonfinite_advantages": "advantage", "actor/nonfinite_loss": "loss",
                    "actor/nonfinite_grad_norm": "gradient norm", "actor/nonfinite_update": "weight after the update"}


class HealthMonitor:
    def __init__(self, cfg: TrainerConfig, out_dir: Path, extra: Sequence[Alarm] = ()):
        """The stop rules of ``cfg`` and its alarms: the trainer's (``alarms.generic_alarms``) and ``extra`` (the
        task's, ``verl.trainer.recipe.recipe_alarms``). ConfigError when ``trainer.stop_on`` names no alarm."""
        self.cfg = cfg
        self.out_dir = out_dir
        self.skipped_in_a_row = 0
        self.last_good_step = 0  # the last step whose update went through (0 = none yet)
        self.steps = self.skipped = 0  # steps observed by this process, and those whose update was skipped
        self.alarms: list[Alarm] = [*generic_alarms(cfg), *extra]
        names = [alarm.name for alarm in self.alarms]
        unknown = [name for name in cfg.stop_on if name not in names]
        if unknown:
            raise ConfigError(f"config key trainer.stop_on={list(cfg.stop_on)} is invalid: {unknown[0]!r} is no "
                              f"alarm; allowed: {', '.join(names)}")
        self.warned: set[str] = set()  # alarms that fired (and warned) already in this run
        self.first_fired: dict[str, tuple[int, str]] = {}  # alarm -> (step, warning line) of its first firing here
        self.stopping: str | None = None  # set when an alarm trainer.stop_on names fired: the run stops

    @classmethod
    def for_run(cls, cfg: Config, out_dir: Path) -> HealthMonitor:
        """The monitor of a run of ``cfg``: the trainer's alarms and its recipe module's (``recipe_alarms``)."""
        return cls(cfg.trainer, out_dir, recipe_alarms(cfg))

    def restore(self, records: list[dict]) -> None:
        """The steps a resumed run already logged (``metrics.jsonl``'s records, in order), for the alarms' state."""
        for record in records:
            if record.get("step", 0) > 0:
                for alarm in self.alarms:
                    alarm.restore(record["step"], record)
                    if record.get(f"health/{alarm.name}"):
                        self.warned.add(alarm.name)

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row] = ()) -> dict[str, float]:
        """Check one step's metrics and trajectory records ``rows`` (``verl.utils.rollout_log``; none: the alarms
        that read rows stay quiet); returns the ``health/*`` and ``monitor/*`` metrics. Raises ``TrainingStopped`` at
        the skipped-update limit; sets ``stopping`` when an alarm ``trainer.stop_on`` names fired."""
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
        return self.check_alarms(step, metrics, rows)

    def check_alarms(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> dict[str, float]:
        """Every alarm's reading of the step: its ``health/<name>`` flag and ``monitor/*`` values; the first firing
        of each is logged as one warning line."""
        health: dict[str, float] = {}
        for alarm in self.alarms:
            reading = alarm.observe(step, metrics, rows)
            health.update(reading.values)
            health[f"health/{alarm.name}"] = float(reading.warning is not None)
            if reading.warning is None:
                continue
            example = f" (example trajectory {reading.example})" if reading.example else ""
            if alarm.name not in self.first_fired:
                self.first_fired[alarm.name] = (step, f"HEALTH ALARM {alarm.name} at step {step}{example}: "
                                                      f"{reading.warning}")
                if alarm.name not in self.warned:
                    logger.warning("%s", self.first_fired[alarm.name][1])
                self.warned.add(alarm.name)
            if alarm.name in self.cfg.stop_on and self.stopping is None:
                self.stopping = (f"stopped at step {step}: the health alarm {alarm.name} fired{example} and "
                                 f"trainer.stop_on names it: {reading.warning}")
        return health
