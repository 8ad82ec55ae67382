"""Trajectories for the supervised cold start (``python -m verl.trainer.main_sft``), written as SFT parquet.

A row is the RL schema (``data_prep.qa_search.PARQUET_SCHEMA``: the same prompt, gold answers, data source and
index as the question's RL row) plus ``turns``: the response in order, ``[{text, sampled}]`` (sampled = the
policy's text, trained; else a block the loop inserts, ``search_r1.llm_agent.formatting``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep.qa_search import PARQUET_SCHEMA, _check_keys

logger = logging.getLogger(__name__)

TURNS_TYPE = pa.list_(pa.struct([("text", pa.string()), ("sampled", pa.bool_())]))
SFT_SCHEMA = PARQUET_SCHEMA.append(pa.field("turns", TURNS_TYPE))


def sft_row(qa_row: dict, turns: list[dict]) -> dict:
    """The SFT row of a question's RL row (``make_row``) and a trajectory's ``turns``."""
    return {**{name: qa_row[name] for name in PARQUET_SCHEMA.names}, "turns": [dict(t) for t in turns]}


def rows_to_sft_parquet(rows: list[dict], path: str | Path) -> None:
    """Write SFT rows to ``path`` with ``SFT_SCHEMA``; parents are created."""
    for i, row in enumerate(rows):
        _check_keys(row, SFT_SCHEMA, f"row {i}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SFT_SCHEMA), path)
    logger.info("wrote %d trajectories to %s", len(rows), path)
