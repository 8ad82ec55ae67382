"""The trajectory record contract (verl/utils/rollout_log.py, docs/design.md "Trajectory records"), checked the same
way for the trainer's files and the evaluation's trajectories.jsonl."""

from __future__ import annotations

FIELDS = {"step", "split", "uid", "group", "index", "data_source", "input", "output", "segments", "queries", "answer",
          "ground_truth", "score", "reward_terms", "advantage", "stop_reason", "num_searches", "turns",
          "response_length", "min_version", "max_version"}


def check_record(record: dict, split: str) -> None:
    """Every field of the contract, with its type; the segments alternate, cover the response and hold the
    inserted blocks."""
    assert FIELDS <= set(record), FIELDS - set(record)
    assert record["split"] == split and record["uid"].startswith(f"{record['group']}-")
    assert isinstance(record["index"], int) and isinstance(record["input"], str) and record["input"]
    assert isinstance(record["queries"], list) and all(isinstance(q, str) for q in record["queries"])
    assert isinstance(record["ground_truth"], list) and all(isinstance(a, str) for a in record["ground_truth"])
    assert isinstance(record["score"], float) and isinstance(record["reward_terms"], dict)
    assert record["advantage"] is None or isinstance(record["advantage"], float)
    segments = record["segments"]
    assert sum(s["tokens"] for s in segments) == record["response_length"] > 0
    assert all(s["kind"] in ("policy", "inserted") and s["tokens"] > 0 and isinstance(s["text"], str)
               for s in segments)
    assert all(a["kind"] != b["kind"] for a, b in zip(segments, segments[1:])), "runs of one kind are one segment"
    assert segments[0]["kind"] == "policy"  # the policy speaks first
