"""The trainer's health alarms (verl/trainer/alarms.py) on constructed runs: each fires on the pattern it watches,
from the step the pattern crosses its threshold, with one warning naming the step and an example trajectory, and
stays quiet on a healthy run (pure objects: no model, no run).

Guards against collapse and reward hacking seen only in the score (Search-R1 #88, #92, #186; ZeroSearch #23;
Agent-R1 #8): before these alarms only the entropy and the clip fraction were watched.
"""

from __future__ import annotations

import random

import pytest

from verl.config import TrainerConfig
from verl.errors import ConfigError
from verl.trainer.alarms import FlatGroups, ShareFall
from verl.trainer.health import HealthMonitor


def rows(groups: list[list[float]], length: int = 100, stop: str = "answered") -> list[dict]:
    """Trajectory records: one group (a prompt's samples) per list of scores."""
    return [{"uid": f"row{g}-{k}", "group": f"row{g}", "score": score, "response_length": length + k + g,
             "stop_reason": stop, "reward_terms": {}}
            for g, scores in enumerate(groups) for k, score in enumerate(scores)]


def healthy_step(step: int, rng: random.Random) -> tuple[dict, list[dict]]:
    """A step of a healthy GRPO run: the entropy, lengths and valid actions wander around where they started, a
    tenth of the rows are cut by the budget, most groups' samples disagree."""
    metrics = {"actor/entropy": 0.6 + rng.uniform(-0.1, 0.1), "actor/pg_clipfrac": rng.uniform(0, 0.05),
               "response_length/mean": 110 + rng.uniform(-20, 20), "train/overlong_frac": rng.uniform(0, 0.15),
               "agent/valid_action_ratio": 0.95 + rng.uniform(-0.05, 0.04), "critic/score/mean": 0.5 + 0.01 * step,
               "actor/kl_loss": 0.004 * step}  # the KL to the reference grows slowly from 0
    groups = [[float(rng.random() < 0.5) for _ in range(5)] for _ in range(8)]
    groups[0] = [0.0, 1.0, 0.0, 0.0, 1.0]  # at least one group that disagrees
    return metrics, rows(groups)


def run(monitor: HealthMonitor, steps: list[tuple[dict, list[dict]]]) -> dict[str, list[int]]:
    """Feed the steps; alarm name -> the steps it fired on."""
    fired: dict[str, list[int]] = {}
    for step, (metrics, step_rows) in enumerate(steps, start=1):
        for key, flag in monitor.observe(step, metrics, step_rows).items():
            if key.startswith("health/") and flag:
                fired.setdefault(key.removeprefix("health/"), []).append(step)
    return fired


def test_a_healthy_run_raises_no_alarm(tmp_path, caplog):
    """Guards against false alarms: thirty steps of a healthy GRPO run (the defaults' demo-like values) fire none."""
    rng = random.Random(0)
    assert run(HealthMonitor(TrainerConfig(), tmp_path), [healthy_step(s, rng) for s in range(1, 31)]) == {}
    assert "HEALTH ALARM" not in caplog.text


def collapsed(step: int, rng: random.Random, alarm: str) -> tuple[dict, list[dict]]:
    """A healthy step, changed from step 6 on to show the pattern ``alarm`` watches."""
    metrics, step_rows = healthy_step(step, rng)
    if step < 6:
        return metrics, step_rows
    if alarm == "length_collapse":  # answers without reasoning or search
        metrics["response_length/mean"] = 30.0
        step_rows = rows([[1.0, 0.0]], length=12)
    elif alarm == "length_budget":  # the policy never stops
        metrics["train/overlong_frac"] = 0.8
    elif alarm == "valid_actions_falling":  # malformed actions
        metrics["agent/valid_action_ratio"] = 0.6
        step_rows = rows([[0.0, 1.0], [0.0, 0.0]])
        step_rows[3]["stop_reason"] = "max_turns"  # row1-1 never answered
    elif alarm == "flat_groups":  # every group all right or all wrong
        step_rows = rows([[1.0] * 5] * 5 + [[0.0] * 5] * 3)
    elif alarm == "clipfrac_explosion":
        metrics["actor/pg_clipfrac"] = 0.7
    elif alarm == "entropy_collapse":
        metrics["actor/entropy"] = 0.05
    elif alarm == "kl_drift":  # the policy runs away from the reference
        metrics["actor/kl_loss"] = 0.3
    elif alarm == "kl_drift_in_reward":  # the same, measured by the KL penalty of the reward
        del metrics["actor/kl_loss"]
        metrics["actor/reward_kl_penalty"] = 0.4
    return metrics, step_rows


EXAMPLES = {"length_collapse": "row0-0", "length_budget": "row7-4", "valid_actions_falling": "row1-1",
            "flat_groups": "row0-0"}


@pytest.mark.parametrize("alarm", ["entropy_collapse", "clipfrac_explosion", "length_collapse", "length_budget",
                                   "valid_actions_falling", "flat_groups", "kl_drift", "kl_drift_in_reward"])
def test_each_alarm_fires_on_its_pattern_once_warned_with_step_and_example(tmp_path, caplog, alarm):
    """The pattern starts at step 6: the alarm fires on steps 6-10, and no other alarm does; it warns once, naming
    its first step and a trajectory that shows the pattern. The shares are averaged over trainer.alarm_window = 5
    steps: flat_groups fires at step 10, its first window of flat steps; valid_actions_falling at step 8, the first
    window whose mean (2 steps near 0.95, 3 at 0.6) is below 0.8 x its start (no turn counts logged here: plain
    means)."""
    rng = random.Random(1)
    fired = run(HealthMonitor(TrainerConfig(), tmp_path), [collapsed(s, rng, alarm) for s in range(1, 11)])
    expected = {"flat_groups": [10], "valid_actions_falling": [8, 9, 10]}.get(alarm, [6, 7, 8, 9, 10])
    name = alarm.removesuffix("_in_reward")
    assert fired == {name: expected}
    warnings = [r.getMessage() for r in caplog.records if "HEALTH ALARM" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(f"HEALTH ALARM {name} at step {expected[0]}")
    if EXAMPLES.get(alarm):
        assert f"(example trajectory {EXAMPLES[alarm]})" in warnings[0]
    assert "What to do" in warnings[0]


# agent/valid_action_ratio of the paper table's R1 row, seed 1 (benchmarks/paper_table_rows/vllm/r1/seed1: the base
# model, 24 turns a step, every group scored 0, so no update but the KL term's). The alarm that compared one step at
# a time with the mean of the first 3 fired at step 4 on it.
R1_VALID_SHARES = [2, 2, 1, 1, 0, 2, 0, 1, 0, 1, 1, 0, 1, 1, 0, 4, 1, 1, 0, 1, 0, 3, 1, 0]  # of 24 turns


# (well-formed turns, turns) of `make grpo` at 30x and at 10x its learning rate (docs/results.md, "Monitors";
# 2026-11-29, dcc1a4a): at 30x the score fell to 0 from step 3 and the share with it; at 10x it dipped for one step
# (122 of 177 at step 11) and came back.
GRPO_30X = [(130, 132), (154, 192), (123, 170), (93, 155), (80, 137), (80, 126), (78, 120), (76, 132)]
GRPO_10X = [(130, 132), (158, 160), (175, 180), (196, 199), (181, 192), (174, 188), (160, 178), (198, 216),
            (197, 217), (176, 204), (122, 177), (159, 190), (168, 186), (166, 183), (199, 204), (190, 192)]


def valid_actions(step: int, valid: int, turns: int = 24) -> tuple[dict, list[dict]]:
    return {"agent/valid_action_ratio": valid / turns, "agent/turns": float(turns)}, rows([[0.0, 1.0]])


def test_valid_actions_falling_allows_for_sampling_noise_and_still_catches_a_fall(tmp_path):
    """Guards against the valid-action alarm warning on noise at a low start, and against the allowance hiding a
    real fall. On the R1 row's logged shares (7 % of 24 turns at the start; 18 of the other 21 steps below 0.8 x
    that) it stays quiet; a policy that stops writing actions from that same start (0 of 24 from step 6) and one
    that falls from 0.95 to 0.6 of 24 turns are caught by step 10, and a monitor restored from the logged steps of
    a resumed run catches them on the same step. On `make grpo`'s logged turns it fires at step 5 of the collapse at
    30x its learning rate (the share from 0.82 at the start to 0.59 over steps 4-5), and not on the one-step dip at
    10x. Without turn counts (a replay of an older run) a full window's plain mean is compared (step 8)."""
    start = sum(R1_VALID_SHARES[:3]) / 72
    assert sum(v / 24 < 0.8 * start for v in R1_VALID_SHARES[3:]) == 18  # what one step at a time warned on
    assert run(HealthMonitor(TrainerConfig(), tmp_path), [valid_actions(s, v) for s, v in
                                                           enumerate(R1_VALID_SHARES, start=1)]) == {}
    stopped = [valid_actions(s, v if s < 6 else 0) for s, v in enumerate([2, 2, 1, 1, 2] + [0] * 10, start=1)]
    fell = [valid_actions(s, 23 if s < 6 else 14) for s in range(1, 16)]
    for steps, first in ((stopped, 10), (fell, 9)):
        assert run(HealthMonitor(TrainerConfig(), tmp_path), steps)["valid_actions_falling"][0] == first
        resumed = HealthMonitor(TrainerConfig(), tmp_path)
        resumed.restore([{"step": s, **metrics} for s, (metrics, _) in enumerate(steps[:first - 2], start=1)])
        late = run(resumed, [({}, [])] * (first - 2) + steps[first - 2:])  # steps before the resume: not seen again
        assert late["valid_actions_falling"][0] == first
    logged = {name: run(HealthMonitor(TrainerConfig(), tmp_path), [valid_actions(s, v, n) for s, (v, n) in
                                                                    enumerate(shares, start=1)])
              for name, shares in (("30x", GRPO_30X), ("10x", GRPO_10X))}
    assert logged["30x"]["valid_actions_falling"][0] == 5 and "valid_actions_falling" not in logged["10x"]
    assert ShareFall._pooled([(0.5, 10.0), (1.0, 0.0)]) == (0.5, 10.0)  # a step of no turns weighs nothing
    uncounted = [({"agent/valid_action_ratio": m["agent/valid_action_ratio"]}, r) for m, r in stopped]
    assert run(HealthMonitor(TrainerConfig(), tmp_path), uncounted)["valid_actions_falling"][0] == 8  # full window


def test_flat_groups_counts_the_rows_of_groups_whose_scores_agree(tmp_path):
    """monitor/flat_groups against a plain count; groups of one are left out (no spread to measure)."""
    rng = random.Random(2)
    for _ in range(20):
        groups = [[float(rng.random() < rng.random()) for _ in range(rng.randint(1, 5))] for _ in range(6)]
        counted = [g for g in groups if len(g) >= 2]
        flat = sum(len(g) for g in counted if len(set(g)) == 1)
        reading = FlatGroups(0.9, 1).observe(1, {}, rows(groups))
        if counted:
            assert reading.values["monitor/flat_groups"] == pytest.approx(flat / sum(len(g) for g in counted))
        else:
            assert reading.values == {}


def test_stop_on_names_are_checked_and_a_named_alarm_stops(tmp_path):
    """trainer.stop_on: a name that is no alarm is a ConfigError listing the alarms (before anything runs); a named
    alarm sets ``stopping`` with the step, the example and the warning; an alarm not named does not."""
    with pytest.raises(ConfigError, match=r"trainer.stop_on=\['entropy'\] is invalid: 'entropy' is no alarm; "
                                          r"allowed: entropy_collapse, clipfrac_explosion, length_collapse"):
        HealthMonitor(TrainerConfig(stop_on=["entropy"]), tmp_path)
    monitor = HealthMonitor(TrainerConfig(stop_on=["flat_groups"], alarm_window=1), tmp_path)
    monitor.observe(1, {"actor/pg_clipfrac": 0.9}, rows([[0.0, 1.0]]))
    assert monitor.stopping is None
    monitor.observe(2, {}, rows([[1.0, 1.0]]))
    assert monitor.stopping.startswith("stopped at step 2: the health alarm flat_groups fired (example trajectory "
                                       "row0-0) and trainer.stop_on names it: 100% of the trajectories")


def test_a_resumed_run_does_not_warn_again_for_an_alarm_that_fired(tmp_path, caplog):
    """The steps logged before a resume (metrics.jsonl) hold health/<name> = 1: the resumed process sets the flag
    when the alarm fires again but does not repeat the warning; an alarm that never fired still warns."""
    logged = [{"step": 1, "actor/pg_clipfrac": 0.9, "health/clipfrac_explosion": 1.0}]
    monitor = HealthMonitor(TrainerConfig(alarm_window=1), tmp_path)
    monitor.restore(logged)
    health = monitor.observe(2, {"actor/pg_clipfrac": 0.9}, rows([[1.0, 1.0]]))
    assert health["health/clipfrac_explosion"] == 1.0 and health["health/flat_groups"] == 1.0
    assert "clipfrac_explosion" not in caplog.text and "HEALTH ALARM flat_groups at step 2" in caplog.text


def test_kl_drift_is_off_at_zero_and_quiet_without_a_kl(tmp_path):
    """trainer.alarm_kl_above=0 turns kl_drift off; a run that logs no KL (no KL loss, no KL in the reward: make demo's
    PPO) never fires it, whatever the threshold."""
    rng = random.Random(2)
    steps = [collapsed(s, rng, "kl_drift") for s in range(1, 11)]
    assert run(HealthMonitor(TrainerConfig(alarm_kl_above=0.0), tmp_path), steps) == {}
    for metrics, _ in steps:
        metrics.pop("actor/kl_loss")
    assert run(HealthMonitor(TrainerConfig(alarm_kl_above=0.01), tmp_path / "b"), steps) == {}
