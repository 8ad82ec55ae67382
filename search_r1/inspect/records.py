"""Trajectory records as the viewer reads them: which files a path names, a sample of their lines, and one
``Record`` per trajectory whatever the file's vintage (docs/design.md, "Trajectory viewer").

Three kinds of line are read, one JSON object each:

- the trajectory record (the run directory's ``rollouts/<step>.jsonl`` and ``validation/<step>.jsonl``, and the
  evaluation's ``trajectories.jsonl`` once it writes the same record): ``step``, ``split``, ``uid``, ``group``,
  ``index``, ``input``, ``output``, ``segments`` (the response in order, ``{"kind": "policy" | "inserted", "text",
  "tokens"}``: inserted = the tokens that got no gradient), ``queries``, ``answer``, ``ground_truth``, ``score``,
  ``reward_terms``, ``advantage``, ``stop_reason``, ``num_searches``, ``turns``, ``response_length``, versions;
- ``trainer.rollout_data_dir`` files written before that record (``verl/utils/rollout_log.py``): step, uid
  (``row<i>`` = dataset row i), input, output, score, stop reason, versions, searches;
- the evaluation's ``trajectories.jsonl`` as ``search_r1.evaluate`` writes it today: row, sample, prompt, response,
  golden, answer, em / subem / f1, searches, turns, response and inserted token counts.

Choices:

- A field a file does not hold stays None and is shown as not recorded; nothing is guessed from text except the
  answer, which ``qa_em.extract_answer`` (the scorer's own parser) takes from the response when a line has none.
  A response without ``segments`` is one block of kind ``unmarked``: which of its tokens were inserted is unknown.
- Exact match (``Record.em``) is the ``em`` reward term when logged, else the evaluation's ``em``, else the answer
  checked against the gold answers (``qa_em.em_check``, SQuAD normalisation); None when a line has no gold answers.
- Large runs: lines are counted first (bytes only), a sample of ``limit`` line numbers is drawn from all of them
  with a fixed seed, and only those lines are parsed. A torn last line (a writer killed mid-line) is skipped with a
  warning; any other line that is not a JSON object is an ``InspectInputError`` naming the file and line.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from search_r1.prompts import PLACEHOLDER, TEMPLATES, question_of
from search_r1.reward.qa_em import em_check, extract_answer
from verl.utils.progress import progress

logger = logging.getLogger(__name__)

EVAL_FILE = "trajectories.jsonl"  # search_r1.evaluate.TRAJECTORIES
RUN_SUBDIRS = {"rollouts": "train", "validation": "val"}  # the run directory's record folders -> their split
SPLITS = ("train", "val", "test")
STEP_FILE = re.compile(r"^(\d+)\.jsonl$")
SAMPLE_SEED = 0
OUTCOMES = ("right", "wrong", "unknown")  # the page's outcome filter (``Record.outcome``)
SEARCHED = ("yes", "no", "unknown")  # the page's search filter (``Record.searched_label``)
RIGHT = 0.5  # a trajectory (or a question's mean over its samples) is right when its EM is at least this
PROGRESS_MIN_BYTES = 64 << 20  # reading less than this shows no bar
_QUESTION = re.compile(r"Question:\s*(.+)")
_ROW_UID = re.compile(r"^row(\d+)$")  # the uid of rollout_log's records: row<dataset index>


class InspectInputError(ValueError):
    """A path, step or file the viewer cannot read; the message names it and what is allowed."""


@dataclass
class Segment:
    kind: str  # "policy" (sampled, trained), "inserted" (by the environment: no gradient) or "unmarked" (unknown)
    text: str
    tokens: int | None  # None where the file does not say


@dataclass
class Record:
    """One trajectory as shown; None = the file does not record it."""

    key: str  # unique on the page: "<side><n>"
    step: int | None
    split: str
    uid: str
    group: str | None
    index: int | None  # dataset row
    data_source: str | None
    input: str  # the prompt
    segments: list[Segment]
    queries: list[str] | None
    answer: str | None
    ground_truth: list[str] | None
    score: float | None
    reward_terms: dict[str, float | None] = field(default_factory=dict)  # None: not scored (NaN in the file)
    advantage: float | None = None
    stop_reason: str | None = None
    num_searches: int | None = None
    turns: int | None = None
    response_length: int | None = None  # tokens
    no_grad_tokens: int | None = None  # inserted tokens (from the segments, or the evaluation's count)
    min_version: int | None = None
    max_version: int | None = None
    em: float | None = None

    @property
    def question(self) -> str:
        """The question, as the prompt template put it in; else what follows the prompt's last "Question:"; else
        the whole prompt."""
        for template in TEMPLATES.values():
            start = self.input.rfind(template.split(PLACEHOLDER)[0])
            found = question_of(self.input[start:], template) if start >= 0 else None
            if found:
                return found
        asked = _QUESTION.findall(self.input)
        return asked[-1].strip() if asked else self.input.strip()

    @property
    def searched(self) -> bool | None:
        if self.num_searches is not None:
            return self.num_searches > 0
        return None if self.queries is None else bool(self.queries)

    @property
    def outcome(self) -> str:
        """``right``, ``wrong`` or ``unknown`` (no EM recorded): the page's outcome filter."""
        return outcome(self.em)

    @property
    def searched_label(self) -> str:
        """``yes``, ``no`` or ``unknown``: the page's search filter."""
        return {True: "yes", False: "no", None: "unknown"}[self.searched]


def outcome(em: float | None) -> str:
    """``right`` (EM at least ``RIGHT``), ``wrong`` or ``unknown`` (None)."""
    return "unknown" if em is None else ("right" if em >= RIGHT else "wrong")


def sample_note(shown: int, total: int, limit: int | None, what: str) -> str:
    """What the page or printout holds: all of ``total``, or a sample of how many."""
    if shown < total:
        return f"A sample of {shown:,} of {total:,} {what} (--limit {limit}; drawn at random with seed {SAMPLE_SEED})."
    return f"All {total:,} {what}."


@dataclass
class TrajFile:
    path: Path
    step: int | None  # from the file name; None for a file that names none (each line may carry its own)
    split: str


@dataclass
class Loaded:
    """A sample of the trajectories of one path."""

    source: str  # the path as given
    files: list[TrajFile]
    records: list[Record]
    total: int  # trajectories in the files (the sample is drawn from these)


def _step_files(directory: Path, split: str) -> list[TrajFile]:
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := STEP_FILE.match(p.name)) and p.is_file()]
    return [TrajFile(p, step, split) for step, p in sorted(found)]


def _configured_dirs(run_dir: Path) -> list[tuple[Path, str]]:
    """``trainer.rollout_data_dir`` / ``validation_data_dir`` that the run's config.yaml names, where they exist."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        return []
    from omegaconf import OmegaConf

    trainer = OmegaConf.to_container(OmegaConf.load(config)).get("trainer") or {}
    dirs = []
    for key, split in (("rollout_data_dir", "train"), ("validation_data_dir", "val")):
        value = trainer.get(key)
        if value and Path(value).is_dir():
            dirs.append((Path(value), split))
    return dirs


def find_files(path: str | Path) -> list[TrajFile]:
    """The trajectory files ``path`` names: a ``.jsonl`` file; an evaluation directory (``trajectories.jsonl``); a
    directory of ``<step>.jsonl``; or a run directory (its ``rollouts/`` and ``validation/``, or the
    ``trainer.rollout_data_dir`` / ``validation_data_dir`` its config.yaml names)."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".jsonl":
            raise InspectInputError(f"{path}: not a .jsonl file (give a run directory, an evaluation directory "
                                    f"or a <step>.jsonl / {EVAL_FILE} file)")
        m = STEP_FILE.match(path.name)
        split = "test" if path.name == EVAL_FILE else RUN_SUBDIRS.get(path.parent.name, "train")
        return [TrajFile(path, int(m.group(1)) if m else None, split)]
    if not path.is_dir():
        raise InspectInputError(f"{path}: no such file or directory")
    if (path / EVAL_FILE).is_file():
        return [TrajFile(path / EVAL_FILE, None, "test")]
    files = _step_files(path, RUN_SUBDIRS.get(path.name, "train"))
    if files:
        return files
    dirs = [(path / name, split) for name, split in RUN_SUBDIRS.items() if (path / name).is_dir()]
    for directory, split in _configured_dirs(path):
        if all(directory.resolve() != d.resolve() for d, _ in dirs):
            dirs.append((directory, split))
    files = [f for directory, split in dirs for f in _step_files(directory, split)]
    if not files:
        raise InspectInputError(
            f"{path}: no trajectories found; give a run directory (with rollouts/ or validation/ holding "
            f"<step>.jsonl, or a config.yaml naming trainer.rollout_data_dir), an evaluation directory (with "
            f"{EVAL_FILE}), a directory of <step>.jsonl files, or one such file")
    return files


def _line_offsets(path: Path, bar) -> list[tuple[int, int]]:
    """(byte offset, line number from 1) of every non-empty line of ``path``."""
    lines, pos = [], 0
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                lines.append((pos, line_no))
            pos += len(line)
            bar.update(len(line))
    return lines


def _parse(raw: bytes, where: str, last: bool) -> dict | None:
    """One line as a dict; None for a torn last line (no newline: its writer was killed)."""
    try:
        value = json.loads(raw)
    except ValueError as err:
        if last and not raw.endswith(b"\n"):
            logger.warning("%s: skipping a torn last line (%d bytes, no newline)", where, len(raw))
            return None
        raise InspectInputError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise InspectInputError(f"{where}: a JSON {type(value).__name__}, not an object (one trajectory record "
                                "per line)")
    return value


def _read_lines(f: TrajFile, lines: list[tuple[int, int]], wanted: list[int]) -> list[tuple[str, dict]]:
    """(``file:line``, parsed line) of the lines ``wanted`` (positions in ``lines``, ascending) of ``f``."""
    out = []
    with f.path.open("rb") as handle:
        for n in wanted:
            offset, line_no = lines[n]
            handle.seek(offset)
            where = f"{f.path}:{line_no}"
            raw = _parse(handle.readline(), where, last=n == len(lines) - 1)
            if raw is not None:
                out.append((where, raw))
    return out


def load(path: str | Path, step: int | None = None, split: str | None = None, limit: int | None = None,
         side: str = "t") -> Loaded:
    """A sample of at most ``limit`` trajectories (all with None) of ``path`` (``find_files``), restricted to
    ``step`` and ``split`` when given; ``side`` prefixes the records' keys ("a", "b" when comparing)."""
    found = find_files(path)
    files = [f for f in found if (split is None or f.split == split) and (step is None or f.step in (step, None))]
    if not files:  # (a file without a step in its name is filtered line by line below)
        wanted = ", ".join(x for x in (f"step {step}" if step is not None else "", f"split {split}" if split else "")
                           if x)
        raise InspectInputError(f"{path}: no trajectory file for {wanted}; it has {describe_files(found)}")
    total_bytes = sum(f.path.stat().st_size for f in files)
    with progress(total=total_bytes, unit="B", unit_scale=True, desc="reading",
                  disable=total_bytes < PROGRESS_MIN_BYTES) as bar:
        lines = [_line_offsets(f.path, bar) for f in files]
    every = [(i, n) for i, per_file in enumerate(lines) for n in range(len(per_file))]
    chosen = every if limit is None or len(every) <= limit else sorted(random.Random(SAMPLE_SEED).sample(every, limit))
    per_file: dict[int, list[int]] = defaultdict(list)
    for i, n in chosen:
        per_file[i].append(n)
    records = []
    for i, f in enumerate(files):
        for where, raw in _read_lines(f, lines[i], per_file[i]):
            try:
                record = to_record(raw, f, f"{side}{len(records)}")
            except (KeyError, TypeError, ValueError) as err:  # a field of the wrong type, a segment without its text
                raise InspectInputError(f"{where}: not a trajectory record ({type(err).__name__}: {err}); see "
                                        "search_r1/inspect/records.py for the fields read") from None
            if step is None or record.step == step:
                records.append(record)
    if step is not None and not records:
        raise InspectInputError(f"{path}: no trajectory of step {step}; it has {describe_files(found)}")
    return Loaded(str(path), files, records, total=len(every))


def describe_files(files: list[TrajFile]) -> str:
    """``train steps 1-24, val steps 0-20`` style summary of the files' steps."""
    parts = []
    for split in SPLITS:
        steps = sorted({f.step for f in files if f.split == split and f.step is not None})
        unnamed = any(f.split == split and f.step is None for f in files)
        if steps:
            shown = f"{steps[0]}-{steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2 \
                else ", ".join(map(str, steps[:12])) + (", ..." if len(steps) > 12 else "")
            parts.append(f"{split} step{'s' if len(steps) > 1 else ''} {shown}")
        if unnamed:
            parts.append(f"{split} trajectories without a step in the file name")
    return "; ".join(parts) or "no trajectory files"


def _segments(raw: dict, output: str) -> list[Segment]:
    given = raw.get("segments")
    if given is None:
        return [Segment("unmarked", output, raw.get("response_length", raw.get("response_tokens")))] if output else []
    return [Segment(str(s["kind"]), str(s["text"]), s.get("tokens")) for s in given]


def _int(value) -> int | None:
    return None if value is None else int(value)


def _float(value) -> float | None:
    """A finite float, or None (absent, or NaN: a reward term that did not score the row)."""
    return None if value is None or not math.isfinite(float(value)) else float(value)


def to_record(raw: dict, f: TrajFile, key: str) -> Record:
    """One line of any of the three kinds (module docstring) as a ``Record``."""
    output = str(raw.get("output", raw.get("response", "")))
    segments = _segments(raw, output)
    index = raw.get("index", raw.get("row"))
    uid = raw.get("uid")
    if index is None and isinstance(uid, str) and (m := _ROW_UID.match(uid)):
        index = int(m.group(1))
    if uid is None:
        uid = f"row{index}/{raw['sample']}" if "sample" in raw else key
    terms = {str(k): _float(v) for k, v in (raw.get("reward_terms") or {}).items()}
    if not terms:  # today's evaluation record: its scores are the terms
        terms = {k: _float(raw[k]) for k in ("em", "subem", "f1") if k in raw}
    gold = raw.get("ground_truth", raw.get("golden"))
    gold = None if gold is None else [str(g) for g in ([gold] if isinstance(gold, str) else gold)]
    answer = raw["answer"] if "answer" in raw else extract_answer(output)
    em = terms.get("em")
    if em is None and gold:
        em = em_check(answer, gold) if answer is not None else 0.0
    inserted = [s.tokens for s in segments if s.kind == "inserted"]
    no_grad = sum(t or 0 for t in inserted) if "segments" in raw else raw.get("inserted_tokens")
    length = raw.get("response_length", raw.get("response_tokens"))
    if length is None and "segments" in raw:
        length = sum(s.tokens or 0 for s in segments)
    step = raw.get("step", f.step)
    return Record(
        key=key, step=_int(step), split=str(raw.get("split", f.split)), uid=str(uid),
        group=None if raw.get("group") is None else str(raw["group"]), index=_int(index),
        data_source=raw.get("data_source"), input=str(raw.get("input", raw.get("prompt", ""))), segments=segments,
        queries=None if raw.get("queries") is None else [str(q) for q in raw["queries"]], answer=answer,
        ground_truth=gold, score=_float(raw.get("score")), reward_terms=terms, advantage=_float(raw.get("advantage")),
        stop_reason=raw.get("stop_reason"), num_searches=_int(raw.get("num_searches", raw.get("searches"))),
        turns=_int(raw.get("turns")), response_length=_int(length), no_grad_tokens=_int(no_grad),
        min_version=_int(raw.get("min_version")), max_version=_int(raw.get("max_version")), em=em)
