"""The JSONL corpus: one ``{"id": str, "contents": "\\"Title\\"\\ntext"}`` per line (docs/design.md,
"Retrieval API and corpus format").

Choices:
- Passage ``i`` is the i-th non-blank line. Indexes store only these row numbers.
- The server keeps the byte offset and length of each line (16 bytes per passage) and reads the
  lines it returns with ``os.pread``, so a corpus of tens of millions of passages is not held in RAM
  as Python strings (the OS page cache holds what is read), and concurrent reads need no lock. Not a
  memory map: a corpus file truncated while the server runs would kill it with SIGBUS; ``pread``
  returns a short line instead, which is reported as an error of that request. Lines are returned
  as raw JSON bytes, not decoded: the server splices them into its answer unchanged.
- The checksum recorded in the manifest is the SHA-256 of the file's bytes; it is computed in the
  same pass that finds the line offsets, so verifying it at load costs no extra read.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm


class CorpusError(ValueError):
    """The corpus file is missing or a line is not a valid passage."""


@dataclass(frozen=True)
class CorpusScan:
    """Where each passage lies in the corpus file, and the file's checksum."""

    path: Path
    sha256: str
    n_bytes: int
    offsets: np.ndarray  # [N] int64: byte offset of passage i's line
    lengths: np.ndarray  # [N] int64: byte length of that line without its newline

    @property
    def count(self) -> int:
        return len(self.offsets)


def scan_corpus(path: str | Path, progress: bool = False) -> CorpusScan:
    """One pass over the file: SHA-256 of all bytes and the offset/length of every non-blank line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    digest = hashlib.sha256()
    offsets, lengths = array("q"), array("q")
    position = 0
    with path.open("rb") as f, tqdm(total=path.stat().st_size, desc=f"scan {path.name}", unit="B", unit_scale=True,
                                    disable=not progress) as bar:
        for line in f:
            digest.update(line)
            body = line.rstrip(b"\r\n")
            if body.strip():
                offsets.append(position)
                lengths.append(len(body))
            position += len(line)
            if len(offsets) % 65536 == 0:
                bar.update(position - bar.n)
        bar.update(position - bar.n)
    return CorpusScan(path=path, sha256=digest.hexdigest(), n_bytes=position,
                      offsets=np.frombuffer(offsets, dtype=np.int64), lengths=np.frombuffer(lengths, dtype=np.int64))


def parse_passage(line: bytes | str, where: str) -> dict:
    """Decode one corpus line into ``{"id": str, "contents": str}``; errors name ``where``."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise CorpusError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
    doc_id, contents = row.get("id"), row.get("contents")
    if not isinstance(doc_id, str):
        raise CorpusError(f"{where}: 'id' must be a string, got {doc_id!r}")
    if not isinstance(contents, str):
        raise CorpusError(f"{where}: 'contents' must be a string, got {type(contents).__name__}")
    return {"id": doc_id, "contents": contents}


def iter_passages(path: str | Path) -> Iterator[str]:
    """Stream the ``contents`` of every passage, in row order (validating each line)."""
    path = Path(path)
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                yield parse_passage(line, f"{path}:{line_no}")["contents"]


class CorpusStore:
    """Random access to corpus lines by row number, read on demand with ``os.pread``."""

    def __init__(self, scan: CorpusScan):
        self.scan = scan
        self._fd = os.open(scan.path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.scan.count

    def fetch(self, rows: np.ndarray) -> list[list[bytes]]:
        """The corpus lines (JSON objects, as bytes) of a ``[B, k]`` array of row numbers; ``-1`` entries
        (no hit) are left out. Lines were validated when the index was built and the checksum at load."""
        found = rows >= 0  # [B, k]
        offsets = self.scan.offsets[rows[found]].tolist()  # [hits], in row-major order
        lengths = self.scan.lengths[rows[found]].tolist()
        lines = [os.pread(self._fd, n, offset) for offset, n in zip(offsets, lengths, strict=True)]
        if any(len(line) != n for line, n in zip(lines, lengths, strict=True)):
            raise CorpusError(f"{self.scan.path} was truncated after the server loaded it; restart the server")
        out, start = [], 0
        for n in found.sum(axis=1).tolist():
            out.append(lines[start:start + n])
            start += n
        return out

    def close(self) -> None:
        os.close(self._fd)
