"""The health alarms: monitors that catch a run collapsing or gaming its reward while it trains (docs/design.md,
"Monitors").

An ``Alarm`` watches one pattern. Every step it gets the step's metrics and the step's trajectory records (every
trained row, in the form of ``verl.utils.rollout_log``; on a replay of a finished run, ``search-r1-inspect
--monitors``, the kept sample) and returns a ``Reading``: the values it logs every step (``monitor/<name>``, when
it measures one of its own), whether it fires, with the warning (what happened and what to do) and an example
trajectory (a record's ``uid``). ``health.HealthMonitor`` logs the warning the first time an alarm fires, sets
``health/<name>`` and stops the run on the alarms ``trainer.stop_on`` names.

Choices:

* **Relative to the run's own start** where a healthy value depends on the run (``Baseline``: the mean over the
  first ``trainer.alarm_baseline_steps`` steps that logged the metric): entropy, response length, the valid-action
  rate, the score and the recall signal. A policy fresh from SFT is sharp and short-spoken from its first step; only
  a fall from where the run started is a collapse.
* **Absolute** where every healthy run sits near one value: the clip fraction (0 on-policy), the share of rows the
  length budget cuts, the share of GRPO groups whose samples all scored the same (the advantage's spread vanishes:
  nothing to learn from), and the shares of rows showing a task's text pattern (``RowShare``).
* **The generic trainer names no task**: the alarms here read the trainer's own metrics and the record's generic
  fields (``group``, ``score``, ``response_length``, ``stop_reason``, ``reward_terms``); a task adds alarms that read
  its text (think blocks, answers, queries, passages) through the recipe module's ``alarms(cfg)``
  (``verl.trainer.recipe.recipe_alarms``), for example ``RowShare`` alarms with its own predicates, or a
  ``ScoreVsSignal`` on its recall metric.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from verl.agent.trajectory import StopReason
from verl.config import TrainerConfig

Row = dict  # one trajectory record (verl.utils.rollout_log): uid, group, score, response_length, segments, ...

SCORE_KEY = "critic/score/mean"  # the step's mean score (step_metrics.data_metrics)


@dataclass
class Reading:
    """What one alarm saw on one step."""

    warning: str | None = None  # what happened and what to do; None = the alarm is quiet this step
    example: str | None = None  # the uid of a trajectory record that shows the pattern
    values: dict[str, float] = field(default_factory=dict)  # logged every step, e.g. {"monitor/flat_groups": 0.4}


class Alarm:
    """A watched pattern. Subclasses set ``name`` (logged as ``health/<name>``: 1 on a step it fired, else 0) and
    implement ``observe``; an alarm with state (a baseline) also ``restore``."""

    name: str = ""
    key: str | None = None  # the metric it reads, or the monitor/<name> it logs

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        """This step's reading from its ``metrics`` and trajectory records ``rows`` (possibly none)."""
        raise NotImplementedError

    def restore(self, step: int, metrics: dict[str, float]) -> None:
        """Take a step that a resumed run logged before (its state only: no warning)."""


class Baseline:
    """The mean of ``key`` over the first ``steps`` steps that logged it: a run's own starting value."""

    def __init__(self, key: str, steps: int):
        self.key, self.steps = key, steps
        self.first: list[float] = []

    def add(self, metrics: dict[str, float]) -> None:
        value = metrics.get(self.key)
        if value is not None and value == value and len(self.first) < self.steps:  # NaN: not measured
            self.first.append(value)

    @property
    def value(self) -> float | None:
        """The starting value, or None before ``steps`` steps logged the metric."""
        return sum(self.first) / len(self.first) if len(self.first) == self.steps else None


def _pick(rows: Sequence[Row], best: Callable[[Row], float]) -> str | None:
    """The uid of the row with the largest ``best(row)`` (None without rows)."""
    return str(max(rows, key=best)["uid"]) if rows else None


class RelativeFall(Alarm):
    """``key`` below ``fraction`` x the run's starting value (``Baseline``; not checked before it is known).
    ``example`` picks the row that shows it best."""

    def __init__(self, name: str, key: str, fraction: float, baseline_steps: int, setting: str, advice: str,
                 example: Callable[[Row], float]):
        self.name, self.key, self.fraction, self.setting, self.advice = name, key, fraction, setting, advice
        self.baseline, self.example = Baseline(key, baseline_steps), example

    def restore(self, step: int, metrics: dict[str, float]) -> None:
        self.baseline.add(metrics)

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        value, start = metrics.get(self.key), self.baseline.value
        self.baseline.add(metrics)
        if value is None or start is None or self.fraction <= 0 or value >= self.fraction * start:
            return Reading()
        return Reading(f"{self.key}={value:.4g} is below {self.fraction:g} x the run's starting {start:.4g} (the mean "
                       f"of its first {self.baseline.steps} step(s); {self.setting}): {self.advice}",
                       _pick(rows, self.example))


def wilson(share: float, count: float, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95 % at z = 1.96) of a share measured over ``count`` events."""
    centre, scale = share + z * z / (2 * count), 1 + z * z / count
    spread = z * (share * (1 - share) / count + z * z / (4 * count * count)) ** 0.5
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


class ShareFall(Alarm):
    """A share of counted events (``key``, measured over ``count_key`` events a step: for example the well-formed
    share of a step's turns) fallen below ``fraction`` x the run's starting share: the first ``baseline_steps`` steps
    pooled (by their counts) against the steps since, at most the last ``window`` of them, from the first step after
    the start. Sampling noise is allowed for on both sides: it fires only when ``fraction`` x start - recent is above
    0 at 95 % confidence (Newcombe's interval for a difference of two shares, from their Wilson intervals), so a
    large fall over many events fires at once and a small count waits for more steps. Compared one step
    at a time with its start, the valid-action share warned on noise: a policy that writes a well-formed action in
    7 % of its turns (the base model of the paper table's R1 row, 24 turns a step) writes 0 or 1 of 24, below
    0.8 x 7 %, in about half its steps by chance. Steps that did not log the count (a replay of an older run) are
    compared as plain means, without the allowance, from the step the window is full."""

    def __init__(self, name: str, key: str, count_key: str, fraction: float, baseline_steps: int, window: int,
                 setting: str, advice: str, example: Callable[[Row], float]):
        self.name, self.key, self.count_key, self.fraction = name, key, count_key, fraction
        self.baseline_steps, self.window, self.setting, self.advice, self.example = \
            baseline_steps, window, setting, advice, example
        self.first: list[tuple[float, float | None]] = []  # (share, events) of the first ``baseline_steps`` steps
        self.recent: list[tuple[float, float | None]] = []  # and of the last ``window`` steps after them

    def restore(self, step: int, metrics: dict[str, float]) -> None:
        share = metrics.get(self.key)
        if share is None or share != share:  # NaN: not measured
            return
        measured = (share, metrics.get(self.count_key))
        if len(self.first) < self.baseline_steps:
            self.first.append(measured)
        else:
            self.recent = [*self.recent, measured][-self.window:]

    @staticmethod
    def _pooled(steps: list[tuple[float, float | None]]) -> tuple[float, float | None]:
        """(share, events) of the steps together; events None (a plain mean) where a step logged no count (a step
        of no events weighs nothing)."""
        events = sum(count or 0 for _, count in steps)
        if events and all(count is not None for _, count in steps):
            return sum(share * count for share, count in steps) / events, events
        return sum(share for share, _ in steps) / len(steps), None

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        self.restore(step, metrics)
        if not self.recent or self.fraction <= 0:
            return Reading()
        (start, start_n), (share, n) = self._pooled(self.first), self._pooled(self.recent)
        counted = bool(start_n and n)
        if not counted and len(self.recent) < self.window:
            return Reading()  # without counts, only a full window's mean stands for the noise allowance
        gap = self.fraction * start - share
        if counted:
            low, high = wilson(start, start_n)[0], wilson(share, n)[1]
            gap -= ((self.fraction * (start - low)) ** 2 + (high - share) ** 2) ** 0.5
            measured = f"{n:.0f} events against {start_n:.0f}, beyond sampling noise at 95 % confidence"
        else:
            measured = "no event counts logged"
        if gap <= 0:
            return Reading()
        return Reading(f"{self.key}={share:.4g} over the last {len(self.recent)} step(s) ({measured}) is below "
                       f"{self.fraction:g} x the run's starting {start:.4g} (its first {self.baseline_steps} "
                       f"step(s); {self.setting}): {self.advice}", _pick(rows, self.example))


LR_ADVICE = "lower actor_rollout_ref.actor.optim.lr and resume from a checkpoint before the fall"


class EntropyCollapse(RelativeFall):
    """``actor/entropy`` below ``fraction`` x the run's starting entropy, or below ``floor`` (any step; None = no
    floor). The GRPO failure of Search-R1 #88, #92 and ZeroSearch #23."""

    ADVICE = ("the policy has stopped exploring (GRPO groups whose samples agree carry no signal). What to do: lower "
              "actor_rollout_ref.actor.optim.lr, add an entropy bonus (actor_rollout_ref.actor.entropy_coeff) or a KL "
              "loss (actor_rollout_ref.actor.use_kl_loss=true, kl_loss_coef), and resume from a checkpoint before the "
              "fall")

    def __init__(self, fraction: float, baseline_steps: int, floor: float | None):
        super().__init__("entropy_collapse", "actor/entropy", fraction, baseline_steps,
                         "trainer.alarm_entropy_fraction", self.ADVICE, lambda row: -row["response_length"])
        self.floor = floor

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        entropy = metrics.get("actor/entropy")
        if entropy is not None and self.floor is not None and entropy < self.floor:
            self.baseline.add(metrics)
            return Reading(f"actor/entropy={entropy:.4g} < trainer.alarm_entropy_below={self.floor:g}: {self.ADVICE}",
                           _pick(rows, lambda row: -row["response_length"]))
        return super().observe(step, metrics, rows)


class Above(Alarm):
    """A logged metric ``key`` above ``limit`` (absolute: every healthy run sits near 0)."""

    def __init__(self, name: str, key: str, limit: float, setting: str, advice: str,
                 example: Callable[[Row], float]):
        self.name, self.key, self.limit, self.setting, self.advice, self.example = \
            name, key, limit, setting, advice, example

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        value = metrics.get(self.key)
        if value is None or value <= self.limit:
            return Reading()
        return Reading(f"{self.key}={value:.4g} > {self.setting}={self.limit:g}: {self.advice}",
                       _pick(rows, self.example))


class KLDrift(Above):
    """The policy's KL divergence from the reference model above ``limit``: ``actor/kl_loss`` (with
    ``actor.use_kl_loss``) or ``actor/reward_kl_penalty`` (with ``algorithm.use_kl_in_reward``), whichever the run logs
    (quiet in a run that logs neither). Absolute: every run starts at 0 (the reference is the policy it starts from).
    The leading sign of a slow collapse: in ``make grpo`` at 10x its learning rate the KL passed 0.25 at step 4, two
    steps before the score fell (docs/design.md, "Monitors")."""

    KEYS = ("actor/kl_loss", "actor/reward_kl_penalty")

    def __init__(self, limit: float):
        super().__init__("kl_drift", self.KEYS[0], limit, "trainer.alarm_kl_above",
                         "the policy is moving away from the model it started from faster than a healthy run does, "
                         "which comes before a collapse of the score. What to do: look at the example; lower "
                         "actor_rollout_ref.actor.optim.lr or raise the KL coefficient "
                         "(actor_rollout_ref.actor.kl_loss_coef, algorithm.kl_ctrl.kl_coef), and resume from a "
                         "checkpoint before the rise", lambda row: row["response_length"])

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        self.key = next((key for key in self.KEYS if metrics.get(key) is not None), self.KEYS[0])
        if self.limit <= 0:
            return Reading()
        return super().observe(step, metrics, rows)


class RowShare(Alarm):
    """The share of a step's rows showing a pattern (``shows(row)``), logged every step as ``monitor/<name>``; fires
    when its mean over the last ``window`` steps that measured it is above ``limit`` (a small batch's share is noisy:
    one step's is not enough). On a replay the live run's logged value, measured over its whole batch, wins over the
    share in the kept sample."""

    def __init__(self, name: str, shows: Callable[[Row], bool], limit: float, window: int, setting: str, what: str,
                 advice: str):
        self.name, self.shows, self.limit, self.window, self.setting, self.what, self.advice = \
            name, shows, limit, window, setting, what, advice
        self.key = f"monitor/{name}"
        self.recent: list[float] = []  # the shares of the last ``window`` steps that measured one

    def restore(self, step: int, metrics: dict[str, float]) -> None:
        share = metrics.get(self.key)
        if share is not None:
            self.recent = [*self.recent, share][-self.window:]

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        showing = [row for row in rows if self.shows(row)]
        share = metrics.get(self.key, len(showing) / len(rows) if rows else None)
        if share is None:
            return Reading()
        self.restore(step, {self.key: share})
        reading, mean = Reading(values={self.key: share}), sum(self.recent) / len(self.recent)
        if len(self.recent) == self.window and mean > self.limit:
            reading.warning = (f"{mean:.0%} of the trajectories {self.what} ({self.key}, the mean of the last "
                               f"{self.window} steps, > {self.setting}={self.limit:g}): {self.advice}")
            reading.example = str(showing[0]["uid"]) if showing else None
        return reading


class FlatGroups(RowShare):
    """The share of rows in groups whose samples all scored the same (every sample right, or every one wrong): their
    group-relative advantage is 0, the step learns nothing from them. Rows of groups of one are not counted."""

    def __init__(self, limit: float, window: int):
        super().__init__("flat_groups", lambda row: False, limit, window, "trainer.alarm_flat_groups_above",
                         "are in groups whose samples all scored the same (zero advantage: nothing learnt from them)",
                         "the prompts are too easy or too hard for the policy, or it has collapsed onto one answer. "
                         "What to do: check actor/entropy; use algorithm.filter_groups.enable=true (dynamic "
                         "sampling), more samples per prompt (actor_rollout_ref.rollout.n) or harder/easier data")

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        sizes = Counter(str(row["group"]) for row in rows)
        scores: dict[str, set[float]] = {}
        for row in rows:
            scores.setdefault(str(row["group"]), set()).add(float(row["score"]))
        self.shows = lambda row: len(scores[str(row["group"])]) == 1
        return super().observe(step, metrics, [row for row in rows if sizes[str(row["group"])] >= 2])


class ScoreVsSignal(Alarm):
    """The score rising while a signal that should rise with it falls: the mean of the last ``window`` steps against
    the run's start (``Baseline``), the score up by at least ``rise`` and ``signal`` down by at least ``drop``. For
    example a search task's retrieval recall: a policy that answers right without finding the answer has learnt to
    answer from memory or to game the scorer, not to search."""

    def __init__(self, name: str, signal: str, rise: float, drop: float, baseline_steps: int, window: int):
        self.name, self.signal, self.rise, self.drop, self.window = name, signal, rise, drop, window
        self.key = signal
        self.starts = (Baseline(SCORE_KEY, baseline_steps), Baseline(signal, baseline_steps))
        self.recent: list[tuple[float, float]] = []  # (score, signal) of the last steps that logged both

    def restore(self, step: int, metrics: dict[str, float]) -> None:
        for start in self.starts:
            start.add(metrics)
        score, signal = metrics.get(SCORE_KEY), metrics.get(self.signal)
        if score is not None and signal is not None and signal == signal:
            self.recent = [*self.recent, (score, signal)][-self.window:]

    def observe(self, step: int, metrics: dict[str, float], rows: Sequence[Row]) -> Reading:
        start_score, start_signal = (start.value for start in self.starts)
        self.restore(step, metrics)
        if start_score is None or start_signal is None or len(self.recent) < self.window:
            return Reading()
        score = sum(s for s, _ in self.recent) / self.window
        signal = sum(s for _, s in self.recent) / self.window
        if score - start_score < self.rise or start_signal - signal < self.drop:
            return Reading()
        term = self.signal.removeprefix("reward/")
        example = _pick(rows, lambda row: row["score"] - row.get("reward_terms", {}).get(term, 0.0))
        return Reading(f"{SCORE_KEY} rose {start_score:.3g} -> {score:.3g} while {self.signal} fell {start_signal:.3g} "
                       f"-> {signal:.3g} (the mean of the last {self.window} steps against the run's first "
                       f"{self.starts[0].steps}; trainer.alarm_score_rise={self.rise:g}, trainer.alarm_signal_drop="
                       f"{self.drop:g}): the reward is being earned without what it should measure (answers from "
                       "memory, or a scorer gamed). What to do: look at the example's answer and evidence "
                       "(search-r1-inspect RUN_DIR), add a term for it to the reward, and resume from before the rise",
                       example)


def not_answered(row: Row) -> float:
    """1 for a trajectory that ended without an answer, else 0 (an example's ranking)."""
    return float(row.get("stop_reason") not in (None, StopReason.ANSWERED.value))


def generic_alarms(cfg: TrainerConfig) -> list[Alarm]:
    """The trainer's own alarms, their thresholds from ``trainer.*``."""
    steps = cfg.alarm_baseline_steps
    return [
        EntropyCollapse(cfg.alarm_entropy_fraction, steps, cfg.alarm_entropy_below),
        Above("clipfrac_explosion", "actor/pg_clipfrac", cfg.alarm_clipfrac_above, "trainer.alarm_clipfrac_above",
              "the updates move the policy far from the one that sampled the batch. What to do: lower "
              "actor_rollout_ref.actor.optim.lr, use fewer actor_rollout_ref.actor.ppo_epochs or a larger "
              "ppo_mini_batch_size; with trainer.max_staleness > 0, lower it", lambda row: 0.0),
        RelativeFall("length_collapse", "response_length/mean", cfg.alarm_length_fraction, steps,
                     "trainer.alarm_length_fraction",
                     "the responses are collapsing (answers without reasoning or search: verl #3960's format "
                     f"breaking, or a reward that pays for brevity). What to do: {LR_ADVICE}",
                     lambda row: -row["response_length"]),
        Above("length_budget", "train/overlong_frac", cfg.alarm_overlong_above, "trainer.alarm_overlong_above",
              "the responses run into the length budget (repetition, or a policy that never answers). What to do: "
              "look at the example; with algorithm.overlong.mode=mask the cut rows teach nothing; raise "
              "data.max_trajectory_length only if the responses are sound", lambda row: row["response_length"]),
        ShareFall("valid_actions_falling", "agent/valid_action_ratio", "agent/turns", cfg.alarm_valid_action_fraction,
                  steps, cfg.alarm_window, "trainer.alarm_valid_action_fraction",
                  "the policy writes fewer well-formed actions (malformed tags or tool calls, verl #3070 and "
                  f"#2364). What to do: {LR_ADVICE}; a format reward term helps", not_answered),
        FlatGroups(cfg.alarm_flat_groups_above, cfg.alarm_window),
        KLDrift(cfg.alarm_kl_above),
    ]
