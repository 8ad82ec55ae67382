"""Real QA data -> parquet in the Search-R1 schema (docs/design.md, "Parquet row schema").

Sources are FlashRAG-format JSONL files (one ``{"id", "question", "golden_answers"}`` per line) or
Hugging Face datasets with the same columns (e.g. ``RUC-NLPIR/FlashRAG_datasets``, config ``nq``).
Several sources merge into one ``train.parquet`` and one ``test.parquet`` under ``--out``; each
row keeps its ``data_source`` so validation can report EM per source.

``--flashrag DIR`` adds the seven QA benchmarks of Search-R1's tables (``FLASHRAG_BENCHMARKS``, or the
names given with ``--datasets``) from a local copy of FlashRAG's dataset repository, whose layout is
``DIR/<name>/{train,dev,test}.jsonl`` with one ``{"id", "question", "golden_answers", "metadata"}``
per line (FlashRAG's dataset card on Hugging Face, ``RUC-NLPIR/FlashRAG_datasets``). Each split file
that exists goes to the split of the same name (``train``/``dev``/``test.parquet``); a benchmark
without ``test.jsonl`` (FlashRAG ships none for hotpotqa, 2wikimultihopqa and musique) is tested on
its ``dev.jsonl``, as Search-R1 does; its rows keep ``extra_info.split = "dev"``.

Choices:

- The prompt is ``search_r1.prompts.make_prompt`` (question stripped, one ``?`` added), the same
  template as the demo data, so one policy serves every source; ``--template PATH`` replaces the
  template by a file's text, whose ``{question}`` placeholder receives the question, and
  ``--template-from-searchr1 CHECKOUT`` by Search-R1's own prompt, read from the user's Search-R1 checkout
  (``data_prep.searchr1_template``: the default's wording is this project's, not Search-R1's). ``prompt.json``
  beside the parquet records the template used and its source (a file's path and SHA-256).
- ``extra_info.index`` is the record's position in its source (0-based, bad records counted), so
  a row can be traced back to its source record even when bad ones were skipped.
- A bad record (no question, no non-empty golden answer, invalid JSON) stops the run with an error
  naming the file, line and id; ``--skip-bad`` skips such records and reports how many. Empty
  strings inside an otherwise good answer list are dropped; non-string answers (e.g. numbers) are
  converted with ``str``.
- Parquet is written with pyarrow and an explicit schema, so column types never depend on the
  data (an all-empty column or an integer-looking answer cannot change the schema).
- Source specs: ``name=path.jsonl`` or ``name=hf:dataset[/config]:split``. A Hugging Face dataset
  id is ``owner/name`` (or a bare ``name``); a third path part is the config:
  ``hf:RUC-NLPIR/FlashRAG_datasets/hotpotqa:train`` = dataset ``RUC-NLPIR/FlashRAG_datasets``,
  config ``hotpotqa``, split ``train``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep.searchr1_template import read_searchr1_template
from search_r1.prompts import DEFAULT_TEMPLATE, TEMPLATES, load_template, make_prompt
from verl.utils.progress import progress

logger = logging.getLogger(__name__)

ABILITY = "fact-reasoning"
PARQUET_SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([
        ("style", pa.string()),
        ("ground_truth", pa.struct([("target", pa.list_(pa.string()))])),
    ])),
    ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())])),
])
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
FLASHRAG_BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
SPLITS = ("train", "dev", "test")
PROMPT_RECORD = "prompt.json"  # beside the parquet: the template used and where it came from


class BadRowError(ValueError):
    """A source record that cannot become a training row (the message names file, line and id)."""


@dataclass(frozen=True)
class SourceSpec:
    """One ``--train``/``--test`` source: a local JSONL path or a Hugging Face dataset split."""

    data_source: str
    path: Path | None = None
    hf_dataset: str | None = None
    hf_config: str | None = None
    hf_split: str | None = None
    source_split: str | None = None  # extra_info.split of its rows when it differs from the output split

    def describe(self) -> str:
        if self.path is not None:
            return str(self.path)
        config = f" config {self.hf_config!r}" if self.hf_config else ""
        return f"Hugging Face dataset {self.hf_dataset!r}{config} split {self.hf_split!r}"


def parse_source_spec(spec: str) -> SourceSpec:
    """``name=path`` or ``name=hf:dataset[/config]:split`` -> SourceSpec; bad specs raise ValueError."""
    name, sep, location = spec.partition("=")
    name = name.strip()
    if not sep or not location:
        raise ValueError(f"bad source spec {spec!r}: expected name=path or name=hf:dataset[/config]:split")
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad data_source name {name!r} in {spec!r}: use letters, digits, '_', '-', '.'")
    if not location.startswith("hf:"):
        return SourceSpec(data_source=name, path=Path(location))
    dataset_part, colon, split = location[len("hf:"):].partition(":")  # a split may hold ":" (train[:100])
    parts = dataset_part.split("/")
    if not colon or not split or not dataset_part or len(parts) > 3 or not all(parts):
        raise ValueError(f"bad Hugging Face spec {spec!r}: expected {name}=hf:owner/dataset[/config]:split")
    dataset, config = ("/".join(parts[:2]), parts[2]) if len(parts) == 3 else (dataset_part, None)
    return SourceSpec(data_source=name, hf_dataset=dataset, hf_config=config, hf_split=split)


def make_row(data_source: str, question: str, answers: Sequence[str] | str, split: str, index: int,
             template: str = DEFAULT_TEMPLATE) -> dict:
    """One parquet row in the Search-R1 schema, the prompt under ``template``; raises ValueError on an empty
    question or no answers."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"missing or empty question: {question!r}")
    if not isinstance(answers, (str, list, tuple)):
        raise ValueError(f"golden answers must be a string or a list of strings, got {type(answers).__name__}")
    answer_list = [answers] if isinstance(answers, str) else answers
    targets = [str(a).strip() for a in answer_list if a is not None and str(a).strip()]
    if not targets:
        raise ValueError(f"no non-empty golden answers: {answers!r}")
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": make_prompt(question, template)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": {"target": targets}},
        "extra_info": {"split": split, "index": int(index)},
    }


def _check_keys(row: dict, schema: pa.Schema | pa.StructType, where: str) -> None:
    """Raise if ``row`` has keys the schema lacks (pyarrow would drop them silently) or lacks some."""
    expected = set(schema.names) if isinstance(schema, pa.Schema) else {f.name for f in schema}
    if set(row) != expected:
        raise ValueError(f"{where}: keys {sorted(row)} do not match the schema {sorted(expected)}")


def rows_to_parquet(rows: list[dict], path: str | Path, schema: pa.Schema = PARQUET_SCHEMA) -> None:
    """Write rows (``make_row`` dicts) to ``path`` with the explicit Search-R1 schema (or ``schema``, one that adds
    fields to it, e.g. ``data_prep.wiki_nq.QA_SCHEMA``'s ``extra_info.answer_bearing``); parents are created."""
    for i, row in enumerate(rows):
        _check_keys(row, schema, f"row {i}")
        _check_keys(row["reward_model"], schema.field("reward_model").type, f"row {i} reward_model")
        _check_keys(row["extra_info"], schema.field("extra_info").type, f"row {i} extra_info")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    logger.info("wrote %d rows to %s", len(rows), path)


def _jsonl_records(path: Path) -> Iterator[tuple[str, dict | None, str]]:
    """(location "file:line", record or None if invalid JSON, parse error) for each non-blank line."""
    if not path.is_file():
        raise ValueError(f"source {path}: " + ("a directory, not a file" if path.is_dir() else "no such file")
                         + ' (allowed: a JSONL file with one {"id", "question", "golden_answers"} per line)')
    with path.open("rb") as raw, progress(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=path.name, leave=False) as bar:
        for line_no, line in enumerate(raw, start=1):
            bar.update(len(line))
            try:
                text = line.decode("utf-8-sig" if line_no == 1 else "utf-8").strip()
                record = json.loads(text) if text else None
            except UnicodeDecodeError as exc:
                yield f"{path}:{line_no}", None, f"invalid UTF-8 ({exc.reason})"
                continue
            except json.JSONDecodeError as exc:
                yield f"{path}:{line_no}", None, f"invalid JSON ({exc.msg})"
                continue
            if not text:
                continue
            if not isinstance(record, dict):
                yield f"{path}:{line_no}", None, "not a JSON object"
                continue
            yield f"{path}:{line_no}", record, ""


def _hf_records(spec: SourceSpec) -> Iterator[tuple[str, dict | None, str]]:
    """(location "dataset row N", record, "") for each record of a Hugging Face dataset split."""
    try:
        import datasets
    except ImportError as exc:
        raise RuntimeError(f"loading {spec.describe()} needs the 'datasets' package: pip install datasets") from exc
    try:
        dataset = datasets.load_dataset(spec.hf_dataset, spec.hf_config, split=spec.hf_split)
    except Exception as exc:  # any loader failure (offline, unknown name, bad split) becomes one clear error
        raise RuntimeError(f"could not load {spec.describe()}: {type(exc).__name__}: {exc}") from exc
    for i, record in enumerate(progress(dataset, desc=spec.data_source, leave=False)):
        yield f"{spec.describe()} row {i}", record, ""


def flashrag_specs(root: Path, names: Sequence[str]) -> dict[str, list[SourceSpec]]:
    """Sources per output split for the FlashRAG benchmarks ``names`` under ``root`` (layout: module docstring)."""
    unknown = [n for n in names if n not in FLASHRAG_BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown FlashRAG benchmark(s) {unknown}; choose among {', '.join(FLASHRAG_BENCHMARKS)}")
    specs: dict[str, list[SourceSpec]] = {split: [] for split in SPLITS}
    for name in names:
        folder = root / name
        files = {split: folder / f"{split}.jsonl" for split in SPLITS if (folder / f"{split}.jsonl").is_file()}
        if not files:
            raise ValueError(f"{folder} holds none of {', '.join(f'{s}.jsonl' for s in SPLITS)} (FlashRAG layout "
                             f"<dir>/<name>/<split>.jsonl); pass --datasets to choose the benchmarks you have")
        for split, path in files.items():
            specs[split].append(SourceSpec(data_source=name, path=path))
        if "test" not in files and "dev" in files:
            specs["test"].append(SourceSpec(data_source=name, path=files["dev"], source_split="dev"))
    return specs


def load_source(spec: SourceSpec, split: str, skip_bad: bool = False,
                template: str = DEFAULT_TEMPLATE) -> tuple[list[dict], int]:
    """All good rows of one source, and the number of bad records skipped (always 0 unless ``skip_bad``).

    Raises BadRowError naming the location and id of the first bad record when ``skip_bad`` is False.
    """
    records = _jsonl_records(spec.path) if spec.path is not None else _hf_records(spec)
    rows, skipped = [], 0
    for index, (where, record, error) in enumerate(records):
        try:
            if record is None:
                raise ValueError(error)
            rows.append(make_row(spec.data_source, record.get("question"), record.get("golden_answers") or [],
                                 spec.source_split or split, index, template))
        except ValueError as exc:
            record_id = record.get("id") if record is not None else None
            message = f"{where}: bad row (id={record_id!r}): {exc}"
            if not skip_bad:
                raise BadRowError(message + "; fix it or pass --skip-bad") from exc
            logger.warning("skipping %s", message)
            skipped += 1
    return rows, skipped


def build_split(specs: Iterable[SourceSpec], split: str, skip_bad: bool = False,
                template: str = DEFAULT_TEMPLATE) -> tuple[list[dict], dict[str, int]]:
    """Merge the rows of several sources (in the given order) and count skipped records per source."""
    rows, skipped_per_source = [], {}
    for spec in specs:
        source_rows, skipped = load_source(spec, split, skip_bad, template)
        rows.extend(source_rows)
        skipped_per_source[spec.data_source] = skipped
        logger.info("%s %s: %d rows, %d skipped", split, spec.data_source, len(source_rows), skipped)
    return rows, skipped_per_source


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.qa_search",
        description="FlashRAG-format JSONL or Hugging Face QA datasets -> Search-R1 parquet (train/test).")
    parser.add_argument("--train", action="append", default=[], metavar="SPEC",
                        help="training source, name=path.jsonl or name=hf:dataset[/config]:split (repeatable)")
    parser.add_argument("--test", action="append", default=[], metavar="SPEC",
                        help="test source, same format as --train (repeatable)")
    parser.add_argument("--flashrag", type=Path, metavar="DIR",
                        help="FlashRAG dataset directory (DIR/<name>/{train,dev,test}.jsonl): adds --datasets")
    parser.add_argument("--datasets", nargs="+", default=list(FLASHRAG_BENCHMARKS), metavar="NAME",
                        help=f"FlashRAG benchmarks to take from --flashrag (default: {' '.join(FLASHRAG_BENCHMARKS)})")
    add_prompt_args(parser, "search_r1.prompts' template of --format, this project's wording")
    parser.add_argument("--format", choices=sorted(TEMPLATES), default="search_r1",
                        help="the action format the prompts ask for (actor_rollout_ref.rollout.multi_turn.format): "
                        "search_r1 = Search-R1's tags, hermes = the chat template's tool calls")
    parser.add_argument("--out", required=True, type=Path,
                        help="output directory; gets train.parquet, dev.parquet (FlashRAG only) and/or test.parquet")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip records without a question or golden answers (counted) instead of failing")
    args = parser.parse_args(argv)
    if not args.train and not args.test and args.flashrag is None:
        parser.error("give --flashrag DIR or at least one --train or --test source")
    return args


def _check_unique(specs: list[SourceSpec], split: str) -> list[SourceSpec]:
    names = [s.data_source for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"the {split} split names a data_source more than once: {duplicates}")
    return specs


def template_file(path: Path) -> dict:
    """The ``--template`` file's text and source (``prompt.json``'s fields); ValueError naming the file when it is
    not a UTF-8 text file with a ``{question}`` placeholder."""
    try:
        text = load_template(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = f"not UTF-8 text ({exc.reason})" if isinstance(exc, UnicodeDecodeError) else exc.strerror
        raise ValueError(f"--template {path}: {reason} (allowed: a UTF-8 text file with a {{question}} "
                         "placeholder)") from None
    return {"template": text, "source": "--template", "path": str(path.resolve()),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def choose_prompt(template: Path | None, template_from_searchr1: Path | None, fmt: str = "search_r1") -> dict:
    """The prompt template and its source, as ``prompt.json`` records them: Search-R1's, read from
    ``--template-from-searchr1``; the ``--template`` file's; or the template of ``--format``
    (``search_r1.prompts.TEMPLATES``). ValueError naming the bad file or combination."""
    if template_from_searchr1 is not None:
        if fmt != "search_r1":
            raise ValueError(f"--template-from-searchr1 gives Search-R1's tag-format prompt; --format {fmt} "
                             "needs a prompt without tags (drop one of the two)")
        return read_searchr1_template(template_from_searchr1).record()
    if template is not None:
        return template_file(template)
    return {"template": TEMPLATES[fmt], "source": f"search_r1.prompts (--format {fmt})", "path": None,
            "sha256": None}


def add_prompt_args(parser: argparse.ArgumentParser, default: str) -> None:
    """``--template PATH`` | ``--template-from-searchr1 CHECKOUT`` (one of them); ``default`` names the prompt used
    without either."""
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--template", type=Path, metavar="PATH",
                        help=f"prompt template file with a {{question}} placeholder (default: {default})")
    prompt.add_argument("--template-from-searchr1", type=Path, metavar="CHECKOUT",
                        help="Search-R1's own prompt, read from your Search-R1 checkout (its "
                        "scripts/data_process/nq_search.py's make_prefix; recorded with its sha256 in prompt.json)")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit status: 0, or 2 with ``error: <message>`` naming the bad
    source, record, template or output path (errors are printed, not raised).

    Every split is built before any file is written, so a bad test row leaves no half-written output, and a
    split without rows is an error (a parquet without rows cannot be trained or evaluated on).
    """
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.out.exists() and not args.out.is_dir():
            raise ValueError(f"--out {args.out} is a file; name a directory (created if missing) to write "
                             f"{', '.join(f'{s}.parquet' for s in SPLITS)} into")
        prompt = choose_prompt(args.template, args.template_from_searchr1, args.format)
        template = prompt["template"]
        specs = {"train": [parse_source_spec(s) for s in args.train], "dev": [],
                 "test": [parse_source_spec(s) for s in args.test]}
        if args.flashrag is not None:
            for split, extra in flashrag_specs(args.flashrag, args.datasets).items():
                specs[split] += extra
        jobs = [(split, _check_unique(specs[split], split)) for split in SPLITS if specs[split]]
        built = [(split, *build_split(split_specs, split, args.skip_bad, template)) for split, split_specs in jobs]
        for split, rows, skipped in built:
            if not rows:
                sources = ", ".join(spec.describe() for spec in dict(jobs)[split])
                raise ValueError(f"no {split} rows: {sources} hold(s) no usable record ({sum(skipped.values())} "
                                 "skipped as bad); give a source with at least one question and golden answer")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / PROMPT_RECORD).write_text(json.dumps(prompt, indent=2, ensure_ascii=False) + "\n")
        for split, rows, skipped in built:
            out_path = args.out / f"{split}.parquet"
            rows_to_parquet(rows, out_path)
            counts = Counter(row["data_source"] for row in rows)
            per_source = ", ".join(f"{name}: {counts[name]} rows, {n} skipped" for name, n in skipped.items())
            print(f"{split}: {len(rows)} rows, {sum(skipped.values())} skipped ({per_source}) -> {out_path}")
        print(f"prompt: {prompt['source']}" + (f" {prompt['path']} (sha256 {prompt['sha256'][:12]}..)"
                                                 if prompt["path"] else "") + f" -> {args.out / PROMPT_RECORD}")
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
