"""A QA parquet made again under another action format's prompt template.

    python -m data_prep.retemplate --format hermes --data data/demo/train.parquet --out DIR/train.parquet

Each row's user message was made from the tag format's template (``search_r1.prompts.DEFAULT_TEMPLATE``, as
``data_prep.demo_kb`` and ``data_prep.qa_search`` write it); it is made again under ``--format``'s template
(``search_r1.prompts.TEMPLATES``), every other column kept. A row whose prompt was not made from the source template
is an error naming the row, never passed through: a hermes run on tag prompts would ask for tags it cannot parse.
For new data, ``data_prep.qa_search --format`` writes the right template directly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from search_r1.prompts import DEFAULT_TEMPLATE, TEMPLATES, load_template, retemplate


def retemplate_parquet(source: Path, out: Path, fmt: str, source_template: str = DEFAULT_TEMPLATE) -> Path:
    """``source``'s rows with each user message made again under ``fmt``'s template, written to ``out``."""
    if fmt not in TEMPLATES:
        raise ValueError(f"unknown action format {fmt!r}; allowed: {', '.join(sorted(TEMPLATES))}")
    table = pq.read_table(source)
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        try:
            row["prompt"] = [{**m, "content": retemplate(m["content"], TEMPLATES[fmt], source_template)}
                             if m["role"] == "user" else m for m in row["prompt"]]
        except ValueError as e:
            raise ValueError(f"{source}: row {i}: {e}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), out)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--format", required=True, choices=sorted(TEMPLATES), help="the action format to write for")
    p.add_argument("--data", required=True, type=Path, help="QA parquet (Search-R1 schema)")
    p.add_argument("--out", required=True, type=Path, help="parquet to write")
    p.add_argument("--source-template", type=Path, metavar="PATH",
                   help="the template --data was made with (default: the tag format's)")
    args = p.parse_args(argv)
    source = load_template(args.source_template) if args.source_template else DEFAULT_TEMPLATE
    try:
        retemplate_parquet(args.data, args.out, args.format, source)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {args.out} ({pq.read_metadata(args.out).num_rows} rows, {args.format} prompts)")


if __name__ == "__main__":
    main()
