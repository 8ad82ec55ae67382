"""The online backend's answers on disk, keyed by (engine, query, top-k): repeated queries cost nothing, and a run
can be replayed exactly with the engine stopped.

Choices:
- One SQLite file, ``DIR/responses.sqlite`` (Python's own ``sqlite3``; one writer, the service): a row per
  (engine, query, k) holding the passages served (a JSON list of ``{"id", "contents"}``) and when they were fetched.
  The engine's raw answer is not kept: what is replayed is exactly what was served, and nothing an engine echoes
  back (request parameters) is written.
- ``engine`` is the engine's name plus what else selects its answers and is not secret (Google's ``cx``): the same
  query to another search engine id is another entry. The API key is never part of a key or a row.
- Entries never expire: a run is replayable for as long as its cache directory is kept; a fresh answer needs a new
  ``--cache-dir`` (or the file deleted). An empty answer (the engine found nothing) is cached like any other;
  an error is never cached.
- Every ``put`` is committed at once, so a service killed mid-run keeps every answer it paid for. The database
  runs in WAL mode with ``synchronous=NORMAL``: a commit is an append to the write-ahead log without an fsync
  (~10 ms each on this machine's disk, more than all the rest of a query's overhead); committed answers survive the
  process being killed, and only a power loss can take the last ones back.
- Counters (lookups, hits) are the service's: ``backend.py`` counts what it answered from here.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

FILE_NAME = "responses.sqlite"


class ResponseCache:
    """``get``/``put`` of the passages served for (engine, query, k); safe to call from several threads."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / FILE_NAME
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")  # commits append to the log: no fsync per answer ...
            self._db.execute("PRAGMA synchronous=NORMAL")  # ... yet a killed process loses nothing committed
            self._db.execute("CREATE TABLE IF NOT EXISTS responses (engine TEXT NOT NULL, query TEXT NOT NULL, "
                             "k INTEGER NOT NULL, passages TEXT NOT NULL, fetched REAL NOT NULL, "
                             "PRIMARY KEY (engine, query, k))")
            self._db.commit()
        except (OSError, sqlite3.Error) as e:
            raise OSError(f"cannot open the response cache {self.path}: {e}; give --cache-dir a writable "
                          "directory") from None
        self._lock = threading.Lock()

    def get(self, engine: str, query: str, k: int) -> list[dict] | None:
        """The passages cached for ``(engine, query, k)``, or None."""
        with self._lock:
            row = self._db.execute("SELECT passages FROM responses WHERE engine = ? AND query = ? AND k = ?",
                                   (engine, query, k)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, engine: str, query: str, k: int, passages: list[dict], fetched: float) -> None:
        """Store (or replace) the passages served for ``(engine, query, k)``, committed at once."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                             (engine, query, k, json.dumps(passages, ensure_ascii=False), fetched))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
