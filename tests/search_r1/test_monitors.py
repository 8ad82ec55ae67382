"""The search task's health alarms (search_r1/monitors.py) on constructed trajectory records, through the recipe
seam (``HealthMonitor.for_run`` of the default config: ``verl.trainer.recipe.recipe_alarms``): each text pattern
fires on trajectories that show it, naming one, and stays quiet on the demo's healthy trajectories (the scripted
turns its tiny policy is warm-started on, ``data_prep.tiny_policy``); the score rising while the retrieval hits fall
fires too.

Guards against reward hacking and degenerate text that the score hides (EM gamed by "A or B or C"; reasoning that
degenerates before the score does: Search-R1 #186, Agent-R1 #8): nothing watched the trajectories' text before.
"""

from __future__ import annotations

import pytest

from data_prep.tiny_policy import THINK_ANSWER, THINK_NEXT_HOP, THINK_SEARCH, THINK_SEARCH_TWO
from search_r1.monitors import PATTERNS as SEARCH_PATTERNS
from search_r1.monitors import copied_answer, hedged_answer, repeated_ngrams, repeated_query, think_empty_or_copied
from verl.config import load_config
from verl.trainer.health import HealthMonitor

QUESTION = "Who founded the guild that built the Ostvar bridge?"
FACT = "The guild that built the Ostvar bridge was founded by Maren Tolk."
PASSAGES = (f"<information>Doc 1(Title: Ostvar bridge) {FACT}\nDoc 2(Title: Maren Tolk) Maren Tolk was born in "
            "Vuzaholm and died in Kessa.</information>")


def record(uid: str, turns: list[str], answer: str | None, queries: list[str], score: float = 1.0) -> dict:
    """A trajectory record (verl.utils.rollout_log) whose policy turns are ``turns``, each followed by the passages."""
    segments = []
    for turn in turns:
        segments += [{"kind": "policy", "text": turn, "tokens": 20}, {"kind": "inserted", "text": PASSAGES,
                                                                      "tokens": 40}]
    return {"uid": uid, "group": uid.rsplit("-", 1)[0], "score": score, "response_length": 60 * len(turns),
            "stop_reason": "answered", "input": f"<|im_start|>user\nAnswer the question. Question: {QUESTION}\n",
            "segments": segments[:-1], "queries": queries, "answer": answer, "reward_terms": {}}


def healthy(uid: str, answer: str) -> dict:
    """A two-hop trajectory of the demo's scripted policy."""
    q1, q2 = "Ostvar bridge guild", "Maren Tolk"
    return record(uid, [THINK_SEARCH_TWO.format(q=q1), THINK_NEXT_HOP.format(fact=FACT, q=q2),
                        THINK_ANSWER.format(fact=FACT, a=answer)], answer, [q1, q2], float(answer == "Maren Tolk"))


HEALTHY = [healthy(f"row{g}-{k}", "Maren Tolk" if (g + k) % 2 else "Kessa") for g in range(4) for k in range(5)] + [
    record("row4-0", [THINK_SEARCH.format(q="Ostvar bridge"), THINK_ANSWER.format(fact=FACT, a="Maren Tolk")],
           "Maren Tolk", ["Ostvar bridge"]),
    record("row4-1", ["<think> I already know this. </think><answer> Paris, France </answer>"], "Paris, France", []),
]

PATTERNS = {  # alarm -> a trajectory that shows it
    "repeated_ngrams": record("bad-0", ["<think> the bridge was built by the guild the bridge was built by the guild "
                                        "the bridge was built by the guild the bridge was built </think>"], None, []),
    "think_empty_or_copied": record("bad-0", ["<think> </think><answer> Maren Tolk </answer>"], "Maren Tolk", []),
    "hedged_answers": record("bad-0", ["<think> Found it. </think><answer> Maren Tolk or Kessa or Vuzaholm </answer>"],
                             "Maren Tolk or Kessa or Vuzaholm", []),
    "copied_answers": record("bad-0", [THINK_SEARCH.format(q="Ostvar"), f"<think> Found it. </think><answer> {FACT} "
                                       "</answer>"], FACT, ["Ostvar"]),
    "repeated_queries": record("bad-0", [THINK_SEARCH_TWO.format(q="Ostvar bridge"), THINK_SEARCH.format(
        q="ostvar Bridge")], None, ["Ostvar bridge", "ostvar Bridge"]),
}


PATTERNS_KEYS = {name: key for name, (_, key, _, _) in SEARCH_PATTERNS.items()}  # alarm -> its monitors.* setting


def test_the_patterns_and_the_demos_trajectories():
    """Each predicate on the trajectories that show its pattern and on the demo's scripted ones (none shows any)."""
    checks = {"repeated_ngrams": repeated_ngrams, "think_empty_or_copied": think_empty_or_copied,
              "hedged_answers": hedged_answer, "copied_answers": copied_answer, "repeated_queries": repeated_query}
    for name, shows in checks.items():
        assert shows(PATTERNS[name]), name
        assert not any(shows(row) for row in HEALTHY), name
    question = record("q-0", ["<think> who founded the guild that built the Ostvar bridge </think><search> x "
                              "</search>"], None, ["x"])
    again = record("a-0", ["<think> I need to search for this. </think><search> a </search>",
                           "<think> I need to search for this. </think><search> b </search>"], None, ["a", "b"])
    assert think_empty_or_copied(question) and not think_empty_or_copied(again)  # demo-real's template: no copy
    assert hedged_answer({"answer": "Kessa; Vuzaholm"}) and hedged_answer({"answer": "Kessa, Vuzaholm, Ostvar"})
    assert not hedged_answer({"answer": "Simon and Garfunkel"}) and not hedged_answer({"answer": None})
    assert copied_answer(record("c-0", [], "who founded the guild that built the Ostvar bridge", []))
    assert not copied_answer(record("c-1", [], "Ostvar bridge", []))  # short: a name the question holds


def search_monitor(tmp_path, *overrides: str) -> HealthMonitor:
    return HealthMonitor.for_run(load_config(list(overrides)), tmp_path)


@pytest.mark.parametrize("alarm", list(PATTERNS))
def test_each_text_alarm_fires_above_its_share_naming_an_example(tmp_path, caplog, alarm):
    """Through the recipe seam with the default settings: a healthy step is quiet (share 0); then 6 of 26 rows a step
    show the pattern (0.23, above every default share) and the alarm alone fires from the first step whose mean share
    over the last trainer.alarm_window steps is above its setting (a plain loop here), its one warning naming one of
    those rows."""
    cfg = load_config([])
    monitor, limit, window = search_monitor(tmp_path), getattr(cfg.monitors, PATTERNS_KEYS[alarm]), \
        cfg.trainer.alarm_window
    quiet = monitor.observe(1, {}, HEALTHY)
    assert [k for k, v in quiet.items() if k.startswith("health/") and v] == []
    assert quiet[f"monitor/{alarm}"] == 0.0
    bad = [dict(PATTERNS[alarm], uid=f"bad-{k}", group="bad") for k in range(6)]
    shares, fired = [0.0], []
    for step in range(2, window + 3):
        health = monitor.observe(step, {}, HEALTHY[:20] + bad)
        shares.append(6 / 26)
        assert health[f"monitor/{alarm}"] == pytest.approx(6 / 26)
        flags = [k for k, v in health.items() if k.startswith("health/") and v]
        assert flags in ([], [f"health/{alarm}"])
        fired += [step] if flags else []
    expected = [s for s in range(window, window + 3) if sum(shares[s - window:s]) / window > limit]
    assert fired == expected and expected[-1] == window + 2
    assert caplog.text.count(f"HEALTH ALARM {alarm}") == 1
    assert f"HEALTH ALARM {alarm} at step {expected[0]} (example trajectory bad-0): " in caplog.text


def test_the_score_rising_while_retrieval_hits_fall_fires(tmp_path, caplog):
    """score_without_retrieval: the score rising while reward/retrieval_hit falls fires from the first step whose
    windowed means (the last trainer.alarm_window steps against the first trainer.alarm_baseline_steps) moved past
    both thresholds (a plain loop here); the score and the hits rising together never fire."""
    t = load_config([]).trainer
    scores = [0.4, 0.4, 0.4, 0.45, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7]
    hits = [0.9, 0.9, 0.9, 0.85, 0.8, 0.6, 0.4, 0.4, 0.4, 0.4, 0.4]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    b, w = t.alarm_baseline_steps, t.alarm_window
    expected = [s for s in range(max(b + 1, w), len(scores) + 1)
                if mean(scores[s - w:s]) - mean(scores[:b]) >= t.alarm_score_rise
                and mean(hits[:b]) - mean(hits[s - w:s]) >= t.alarm_signal_drop]
    monitor = search_monitor(tmp_path)
    fired = [step for step, (s, h) in enumerate(zip(scores, hits, strict=True), start=1)
             if monitor.observe(step, {"critic/score/mean": s, "reward/retrieval_hit": h}, HEALTHY)[
                 "health/score_without_retrieval"]]
    assert fired == expected and expected[0] < len(scores)
    assert f"HEALTH ALARM score_without_retrieval at step {expected[0]} (example trajectory row0-1): " \
           "critic/score/mean rose 0.4 -> " in caplog.text
    rising = search_monitor(tmp_path)
    assert not any(rising.observe(step, {"critic/score/mean": s, "reward/retrieval_hit": s + 0.3}, HEALTHY)[
        "health/score_without_retrieval"] for step, s in enumerate(scores, start=1))


def test_stop_on_takes_the_recipes_alarms(tmp_path):
    """trainer.stop_on may name the search task's alarms (registered through the recipe seam); the error for a wrong
    name lists them with the trainer's."""
    assert search_monitor(tmp_path, "trainer.stop_on=[hedged_answers]").cfg.stop_on == ["hedged_answers"]
    with pytest.raises(Exception, match=r"'hedging' is no alarm; allowed: .*flat_groups, kl_drift, repeated_ngrams, "
                                        r"think_empty_or_copied, hedged_answers, copied_answers, repeated_queries, "
                                        r"score_without_retrieval"):
        search_monitor(tmp_path, "trainer.stop_on=[hedging]")
