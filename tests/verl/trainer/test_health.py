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


# --- the alarms, calibrated to the run (issue 57's item 5) ------------------------------------------------------------
# actor/entropy per step of the user's GRPO run right after the README's cold start (step 1: 0.033), continued with
# healthy steps around it; and a constructed collapse of a run that starts near 1 nat.
AFTER_SFT = [0.033, 0.031, 0.036, 0.029, 0.034, 0.030, 0.032, 0.035]
COLLAPSE = [0.91, 0.87, 0.83, 0.70, 0.42, 0.15, 0.06, 0.02]


def alarms(monitor: HealthMonitor, entropies: list[float], first_step: int = 1,
           clipfrac: float = 0.0) -> dict[int, float]:
    """health/entropy_collapse of each step fed (actor/entropy from ``entropies``)."""
    return {step: monitor.observe(step, {"actor/entropy": e, "actor/pg_clipfrac": clipfrac})["health/entropy_collapse"]
            for step, e in enumerate(entropies, start=first_step)}


def test_a_run_from_an_sft_checkpoint_raises_no_entropy_alarm(tmp_path, caplog):
    """Guards against 'HEALTH ALARM entropy collapse' at step 1 right after the README's own cold start: the
    entropy threshold was absolute (0.05 nats), and a policy fresh from SFT is that sharp from its first step."""
    monitor = HealthMonitor(TrainerConfig(), tmp_path)
    assert set(alarms(monitor, AFTER_SFT).values()) == {0.0}
    assert "HEALTH ALARM" not in caplog.text


def test_a_constructed_collapse_raises_the_alarm_saying_what_to_do(tmp_path, caplog):
    """Entropy falling below a tenth of the run's start (the mean of its first 3 steps, 0.87) fires from the step it
    does (0.06 < 0.087), with a warning that says what to do; the same fall relative to an SFT start fires too."""
    monitor = HealthMonitor(TrainerConfig(), tmp_path)
    fired = alarms(monitor, COLLAPSE)
    assert [step for step, on in fired.items() if on] == [7, 8]
    assert "HEALTH ALARM entropy_collapse at step 7: actor/entropy=0.06 is below 0.1 x the run's starting 0.87" \
        in caplog.text
    assert "What to do: lower actor_rollout_ref.actor.optim.lr" in caplog.text
    sharp = HealthMonitor(TrainerConfig(), tmp_path)
    assert [step for step, on in alarms(sharp, AFTER_SFT[:3] + [0.003]).items() if on] == [4]


def test_the_starting_entropy_survives_a_resume(tmp_path):
    """A resumed run takes its starting entropy from the steps it logged before (metrics.jsonl), not from the
    first steps after the resume: resumed at step 5 of the collapse, steps 7-8 still alarm; and a resumed run from
    SFT still does not."""
    logged = [{"step": 0, "val/em": 0.1}] + [{"step": s, "actor/entropy": e} for s, e in enumerate(COLLAPSE[:5], 1)]
    monitor = HealthMonitor(TrainerConfig(), tmp_path)
    monitor.restore(logged)
    assert [step for step, on in alarms(monitor, COLLAPSE[5:], first_step=6).items() if on] == [7, 8]
    sft = HealthMonitor(TrainerConfig(), tmp_path)
    sft.restore([{"step": s, "actor/entropy": e} for s, e in enumerate(AFTER_SFT[:4], 1)])
    assert set(alarms(sft, AFTER_SFT[4:], first_step=5).values()) == {0.0}


def test_the_absolute_floor_and_the_clip_fraction_alarm(tmp_path, caplog):
    """trainer.alarm_entropy_below still fires at any step when set; the clip-fraction alarm says what to do."""
    monitor = HealthMonitor(TrainerConfig(alarm_entropy_below=0.05), tmp_path)
    assert alarms(monitor, AFTER_SFT[:1]) == {1: 1.0}
    monitor = HealthMonitor(TrainerConfig(), tmp_path)
    health = monitor.observe(1, {"actor/entropy": 0.8, "actor/pg_clipfrac": 0.7})
    assert (health["health/entropy_collapse"], health["health/clipfrac_explosion"]) == (0.0, 1.0)
    assert "HEALTH ALARM clipfrac_explosion at step 1: actor/pg_clipfrac=0.7 > trainer.alarm_clipfrac_above=0.5" \
        in caplog.text
    assert "What to do: lower actor_rollout_ref.actor.optim.lr" in caplog.text
