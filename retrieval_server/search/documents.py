"""Whole documents by corpus id: what ``POST /doc`` answers (the agent's ``open`` tool).

``POST /doc {"ids": [str, ...]}`` -> ``{"docs": [{"id": str, "contents": str}, ...]}`` in the order asked; an id the
corpus does not have -> 404 ``{"detail": "...", "id": <the first unknown id>}``.

Choices:
- The id -> row map is built on the first ``/doc`` request (one pass over the corpus, in a thread), not at start-up:
  a service that is only searched pays nothing. It holds 16 bytes per passage (a 64-bit hash of each id and its row,
  sorted), not a dict of Python strings (about 100 bytes per passage), so a 21M-passage corpus costs ~340 MB. A hash
  hit is confirmed by reading the line and comparing its id, so colliding hashes cannot return the wrong document.
- The lines are spliced into the answer as they are in the corpus, as ``/retrieve`` does.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass

import numpy as np

from retrieval_server.index.corpus import CorpusStore, parse_passage


class UnknownDocument(KeyError):
    """An id the corpus does not have."""

    def __init__(self, doc_id: str) -> None:
        super().__init__(doc_id)
        self.doc_id = doc_id


@dataclass(frozen=True)
class DocRequest:
    ids: list[str]


def parse_doc_request(payload: object, max_ids: int) -> DocRequest | str:
    """The ids of a ``/doc`` body (parsed JSON), or the problem with it (what is allowed)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("ids"), list):
        return "request body must be a JSON object {\"ids\": [str, ...]}"
    ids = payload["ids"]
    if len(ids) > max_ids:
        return f"{len(ids)} ids in one request; the limit is {max_ids}"
    for i, doc_id in enumerate(ids):
        if not isinstance(doc_id, str):
            return f"ids[{i}] must be a string, got {type(doc_id).__name__}"
    return DocRequest(ids)


def _hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


class DocumentIndex:
    """Corpus rows by id, over a ``CorpusStore`` (module docstring)."""

    def __init__(self, corpus: CorpusStore) -> None:
        self.corpus = corpus
        self._lock = threading.Lock()
        self._hashes: np.ndarray | None = None  # [N] uint64, sorted
        self._rows: np.ndarray | None = None  # [N] int64, the row of each hash

    def _build(self) -> None:
        with self._lock:
            if self._hashes is not None:
                return
            n = len(self.corpus)
            hashes = np.empty(n, dtype=np.uint64)
            for start in range(0, n, 65536):
                rows = np.arange(start, min(start + 65536, n))[:, None]  # [b, 1]
                lines = [line for (line,) in self.corpus.fetch(rows)]
                hashes[start:start + len(lines)] = [_hash(json.loads(line)["id"]) for line in lines]
            order = np.argsort(hashes, kind="stable")
            self._rows, self._hashes = order.astype(np.int64), hashes[order]

    def _line(self, doc_id: str) -> bytes:
        h = np.uint64(_hash(doc_id))
        lo, hi = np.searchsorted(self._hashes, h, "left"), np.searchsorted(self._hashes, h, "right")
        if hi > lo:
            candidates = self.corpus.fetch(self._rows[lo:hi][:, None])
            for (line,) in candidates:
                if parse_passage(line, "corpus")["id"] == doc_id:
                    return line
        raise UnknownDocument(doc_id)

    def render(self, ids: list[str]) -> bytes:
        """The ``/doc`` answer for ``ids``; raises ``UnknownDocument`` for the first id not in the corpus."""
        self._build()
        lines = [self._line(doc_id) for doc_id in ids]
        return b'{"docs": [' + b", ".join(lines) + b"]}"
