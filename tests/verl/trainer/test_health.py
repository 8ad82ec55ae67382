"""The health monitor's stop rules, on the metrics a step logs (a pure object: no model, no run).

Guards against a run that skips most of its updates training on for ever: only ``max_skipped_updates`` in a row
stopped a run, so a run alternating NaN and finite steps never stopped. Checked against a plain count.
"""

from __future__ import annotations

import pytest

from verl.config import TrainerConfig
from verl.trainer.health import HealthMonitor, TrainingStopped


def steps(monitor: HealthMonitor, skipped: list[bool]) -> int | None:
    """Feed one step per entry (True = its update was skipped); the step the run stopped at, or None."""
    for step, skip in enumerate(skipped, start=1):
        metrics = {"actor/skipped_updates": float(skip), "actor/nonfinite_loss": float(skip)}
        try:
            monitor.observe(step, metrics)
        except TrainingStopped:
            return step
    return None


def expected_stop(skipped: list[bool], in_a_row: int, share: float) -> int | None:
    row = total = 0
    for step, skip in enumerate(skipped, start=1):
        row, total = (row + 1, total + 1) if skip else (0, total)
        if row >= in_a_row or (total >= in_a_row and total / step > share):
            return step
    return None


@pytest.mark.parametrize("pattern", [
    [False, True] * 10,  # every other step skipped: half, never over 0.5
    [True, False] * 10,  # the first step skipped: over half at every odd step
    [True, True, False, True, False, False, True] * 3,
    [False] * 5 + [True, True, True],
    [True, False, False] * 7,
])
@pytest.mark.parametrize("in_a_row, share", [(3, 0.5), (2, 0.3), (4, 0.9)])
def test_the_run_stops_at_the_in_a_row_or_the_share_limit(tmp_path, pattern, in_a_row, share):
    monitor = HealthMonitor(TrainerConfig(max_skipped_updates=in_a_row, max_skipped_share=share), tmp_path)
    assert steps(monitor, pattern) == expected_stop(pattern, in_a_row, share)


def test_the_share_message_names_the_counts_and_the_key(tmp_path):
    monitor = HealthMonitor(TrainerConfig(max_skipped_updates=3, max_skipped_share=0.5), tmp_path)
    with pytest.raises(TrainingStopped, match=r"stopped at step 5: the actor update was skipped in 3 of 5 steps "
                                              r"\(trainer.max_skipped_share=0.5\) because a loss was NaN/Inf"):
        for step, skip in enumerate([True, False, True, False, True], start=1):
            monitor.observe(step, {"actor/skipped_updates": float(skip), "actor/nonfinite_loss": float(skip)})
