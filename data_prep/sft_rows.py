"""SFT parquet rows: a question's RL row (``data_prep.qa_search.PARQUET_SCHEMA``) plus ``turns``, the response in order
as ``[{text, sampled}]`` (``verl.utils.sft_dataset`` reads them); shared by the cold start's sources."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep.qa_search import PARQUET_SCHEMA, _check_keys
from search_r1.reward.qa_em import ground_truth_answers

logger = logging.getLogger(__name__)

TURNS_TYPE = pa.list_(pa.struct([("text", pa.string()), ("sampled", pa.bool_())]))
# tools: the JSON schemas the prompt shows (the hermes action format), as a JSON string; null = none (tags)
SFT_SCHEMA = PARQUET_SCHEMA.append(pa.field("turns", TURNS_TYPE)).append(pa.field("tools", pa.string()))


def sft_row(qa_row: dict, turns: list[dict], tools: list[dict] | None = None) -> dict:
    """The SFT row of a question's RL row (``make_row``), a trajectory's ``turns`` and the ``tools`` its prompt
    shows (hermes format; None = none)."""
    return {**{name: qa_row[name] for name in PARQUET_SCHEMA.names}, "turns": [dict(t) for t in turns],
            "tools": json.dumps(tools) if tools else None}


def rows_to_sft_parquet(rows: list[dict], path: str | Path) -> None:
    """Write SFT rows to ``path`` with ``SFT_SCHEMA``; parents are created."""
    for i, row in enumerate(rows):
        _check_keys(row, SFT_SCHEMA, f"row {i}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SFT_SCHEMA), path)
    logger.info("wrote %d trajectories to %s", len(rows), path)


def qa_fields(row: dict, index: int) -> dict:
    """A QA parquet row as ``PARQUET_SCHEMA``'s fields (optional ones filled as the RL dataset reads them)."""
    extra = row.get("extra_info") or {}
    return {"data_source": row.get("data_source") or "unknown", "prompt": row["prompt"],
            "ability": row.get("ability") or "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": gold_answers(row)}},
            "extra_info": {"split": str(extra.get("split", "train")), "index": int(extra.get("index", index))}}


def gold_answers(row: dict) -> list[str]:
    return ground_truth_answers((row.get("reward_model") or {}).get("ground_truth") or [])


KEPT = ("one_search", "two_searches", "rephrased", "phrase_first", "exact_match")  # the outcomes of kept trajectories


def summary(counts: Counter, out: Path) -> str:
    """``kept K of N (one_search: a, two_searches: b); dropped D (reason: n, ...) -> out``."""
    kept = {r: counts[r] for r in KEPT if counts[r]}
    dropped = {r: n for r, n in sorted(counts.items()) if r not in KEPT}
    text = f"kept {sum(kept.values())} of {sum(counts.values())} ({', '.join(f'{r}: {n}' for r, n in kept.items())})"
    text += f"; dropped {sum(dropped.values())}"
    if dropped:
        text += f" ({', '.join(f'{r}: {n}' for r, n in dropped.items())})"
    return f"{text} -> {out}"
