"""``search-r1-inspect --monitors RUN_DIR``: the health alarms replayed over a finished (or running) run directory.

The run's ``config.yaml`` gives the alarms and their thresholds (``key=value`` arguments after the directory
replace them, to try other thresholds); its ``metrics.jsonl`` gives every step's metrics, and its kept training
trajectories (``rollouts/<step>.jsonl``, or ``trainer.rollout_data_dir``) the rows of the alarms that read text.
Each step goes through ``verl.trainer.health.HealthMonitor.check_alarms`` in order, as in the run, so a replay of a
run made with these alarms reproduces their firings; on a run made before them, the row alarms see the kept sample
(by default 64 rows a step) instead of the whole batch. The stop rules (skipped updates) are not replayed.

The printout: per alarm, the range of what it measures over the run, the first step it fired (with its warning
line, which names an example trajectory) and how many steps it fired on; then the score: its peak (the mean over
``trainer.alarm_window`` steps) and the first step after the peak at which that mean fell ``SCORE_FALL`` below it,
so "did the alarms fire before the score fell" is read off one screen.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from search_r1.inspect.records import InspectInputError, find_files
from verl.config import Config, ConfigError, load_config
from verl.trainer.alarms import SCORE_KEY
from verl.trainer.health import HealthMonitor
from verl.utils.tracking import read_metrics

logger = logging.getLogger(__name__)

SCORE_FALL = 0.1  # a fall of the windowed mean score below its peak that counts as "the score fell"


@dataclass
class AlarmReplay:
    """One alarm over the run."""

    name: str
    key: str | None  # the metric it reads or the monitor/<name> it logs
    values: list[float] = field(default_factory=list)  # that metric per step where measured
    fired: list[int] = field(default_factory=list)  # the steps it fired on
    first_warning: str | None = None  # the warning line of its first firing


@dataclass
class Replay:
    run_dir: Path
    steps: int  # steps logged
    steps_with_rows: int  # steps whose kept trajectories were read
    alarms: list[AlarmReplay]
    score_peak: tuple[int, float] | None  # (step, windowed mean score) at the peak
    score_fell_at: int | None  # the first step after the peak whose windowed mean is SCORE_FALL below it


def run_config(run_dir: Path, overrides: list[str]) -> Config:
    """The run's config (its ``config.yaml``, keys it predates at their defaults) with ``overrides``."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise InspectInputError(f"{run_dir}: no config.yaml; --monitors replays a run directory (made by the trainer)")
    try:
        cfg = load_config([*overrides, "trainer.stop_on=[]"], files=[path])
    except ConfigError as err:
        raise InspectInputError(f"{path}: {err}") from None
    return cfg


def train_rows(run_dir: Path) -> dict[int, list[dict]]:
    """The kept training trajectories per step (none when the run kept none)."""
    try:
        files = [f for f in find_files(run_dir) if f.split == "train" and f.step is not None]
    except InspectInputError:
        return {}
    rows: dict[int, list[dict]] = {}
    for f in files:
        lines = f.path.read_text(encoding="utf-8").splitlines()
        try:
            rows[f.step] = [json.loads(line) for line in lines if line.strip()]
        except json.JSONDecodeError as err:
            raise InspectInputError(f"{f.path}: not one JSON record a line ({err})") from None
    return rows


def windowed_scores(records: list[dict], window: int) -> list[tuple[int, float]]:
    """(step, mean score of the last ``window`` logged steps up to it), from the ``window``-th step on."""
    scored = [(r["step"], r[SCORE_KEY]) for r in records if SCORE_KEY in r]
    return [(scored[i][0], sum(s for _, s in scored[i + 1 - window:i + 1]) / window)
            for i in range(window - 1, len(scored))]


def replay(run_dir: str | Path, overrides: list[str] | None = None) -> Replay:
    """Every alarm of the run's config over its logged steps and kept trajectories (module docstring)."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir, overrides or [])
    if not (run_dir / "metrics.jsonl").is_file():
        raise InspectInputError(f"{run_dir}: no metrics.jsonl (the run logged no step yet)")
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step", 0) > 0]
    rows = train_rows(run_dir)
    health = HealthMonitor.for_run(cfg, run_dir)
    health.warned = {alarm.name for alarm in health.alarms}  # the first firings are printed below, not logged
    alarms = [AlarmReplay(a.name, a.key) for a in health.alarms]
    for record in records:
        step = record["step"]
        metrics = {k: v for k, v in record.items() if not k.startswith("health/")}
        flags = health.check_alarms(step, metrics, rows.get(step, []))
        for alarm in alarms:
            value = flags.get(alarm.key, record.get(alarm.key))  # its own monitor/* value, or the metric it reads
            if isinstance(value, int | float):
                alarm.values.append(float(value))
            if flags[f"health/{alarm.name}"]:
                alarm.fired.append(step)
    for alarm in alarms:
        alarm.first_warning = health.first_fired.get(alarm.name, (None, None))[1]
    scores = windowed_scores(records, cfg.trainer.alarm_window)
    peak = max(scores, key=lambda s: s[1]) if scores else None
    fell = next((step for step, s in scores if peak and step > peak[0] and s <= peak[1] - SCORE_FALL), None)
    return Replay(run_dir, len(records), sum(r["step"] in rows for r in records), alarms, peak, fell)


def print_replay(result: Replay, console) -> None:
    """The replay as a rich table and the first warning of each alarm that fired."""
    from rich.table import Table

    table = Table(title=f"health alarms over {result.run_dir}: {result.steps} steps ({result.steps_with_rows} with "
                        "kept trajectories)")
    for column in ("alarm", "what it reads: min / median / max", "first fired", "steps fired"):
        table.add_column(column, no_wrap=column == "alarm")
    for a in result.alarms:
        ordered = sorted(a.values)
        spread = (f"{ordered[0]:.3g} / {ordered[len(ordered) // 2]:.3g} / {ordered[-1]:.3g}" if ordered else "-")
        table.add_row(a.name, f"{a.key}: {spread}", str(a.fired[0]) if a.fired else "never", str(len(a.fired)))
    console.print(table)
    for a in result.alarms:
        if a.first_warning:
            console.print(a.first_warning)
    if result.score_peak is None:
        console.print(f"score: fewer logged steps than the window; no {SCORE_KEY} trend")
        return
    step, peak = result.score_peak
    fell = (f"first fell {SCORE_FALL:g} below it at step {result.score_fell_at}" if result.score_fell_at else
            f"never fell {SCORE_FALL:g} below it")
    console.print(f"score ({SCORE_KEY}, windowed mean): peak {peak:.3f} at step {step}; {fell}")
