"""What the retrieval processes log: the entry points' logging setup, and the service's per-interval summary.

Choices:
- One setup for ``serve``, ``build_index`` and ``import_index``: INFO to stderr, with the INFO chatter of
  libraries raised to WARNING (``QUIET_LOGGERS``), so their warnings and errors still show.
- The service logs no line per request (uvicorn's access log is off): every ``--log-interval`` seconds in
  which ``/retrieve`` requests arrived it logs one line, ``retrieval: 412 requests, 9,880 queries in 30 s
  (329 q/s), p50 21.0 ms, p99 48.3 ms, 0 errors (4xx 0, 5xx 0)``. Requests, queries and latencies are those
  of the requests answered (status < 400); errors are the requests refused (4xx) or failed (5xx), counted
  beside them, so that a burst of fast 4xx does not lower the latencies. Latency is the handler's wall time
  (body read, validation, queueing in the coalescer, search, rendering), not the network's.
- The counters live on the event loop's thread only (the handler records, an asyncio task summarises),
  so they need no lock; the latencies of one interval are kept in a list and sorted at the summary.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Library loggers whose INFO lines are noise: FAISS's loader reports every optional build it probes (AVX512,
# AVX2) with the import error of each one that is not installed; httpx logs every request it sends
# ("HTTP Request: POST ..."; huggingface_hub sends them while an encoder loads).
QUIET_LOGGERS = ("faiss.loader", "httpx")


def configure_logging() -> None:
    """INFO to stderr in ``LOG_FORMAT``; the ``QUIET_LOGGERS`` at WARNING."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class RequestStats:
    """Counts of the ``/retrieve`` requests since the last ``summary()``; event-loop thread only."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.started = time.monotonic()
        self.latencies_s: list[float] = []  # one per answered request
        self.queries = 0  # in the answered requests
        self.errors_4xx = 0
        self.errors_5xx = 0

    def record(self, status: int, n_queries: int, seconds: float) -> None:
        """One request answered with ``status`` after ``seconds``; ``n_queries`` counts only if it succeeded."""
        if status >= 500:
            self.errors_5xx += 1
        elif status >= 400:
            self.errors_4xx += 1
        else:
            self.latencies_s.append(seconds)
            self.queries += n_queries

    def summary(self) -> str | None:
        """The line for the interval since the last call (None if no request came), and start a new interval."""
        elapsed = time.monotonic() - self.started
        requests, errors = len(self.latencies_s), self.errors_4xx + self.errors_5xx
        if requests + errors == 0:
            self._reset()
            return None
        latencies = sorted(self.latencies_s)
        latency = (f"p50 {_percentile_ms(latencies, 50):.1f} ms, p99 {_percentile_ms(latencies, 99):.1f} ms"
                   if latencies else "p50 -, p99 -")
        line = (f"retrieval: {requests:,} requests, {self.queries:,} queries in {round(elapsed, 1):g} s "
                f"({_rate(self.queries / elapsed)} q/s), {latency}, "
                f"{errors:,} errors (4xx {self.errors_4xx:,}, 5xx {self.errors_5xx:,})")
        self._reset()
        return line


def _percentile_ms(sorted_s: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ascending seconds, in milliseconds."""
    return 1000 * sorted_s[max(0, math.ceil(p / 100 * len(sorted_s)) - 1)]


async def log_summaries(stats: RequestStats, interval_s: float,
                        backend_summary: Callable[[], str | None] | None = None) -> None:
    """Log ``stats.summary()`` every ``interval_s`` seconds in which requests came, followed by the backend's own
    totals when it has some (``backend_summary``); runs until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        line = stats.summary()
        if line is not None:
            extra = backend_summary() if backend_summary is not None else None
            logger.info("%s", line if extra is None else f"{line}; {extra}")


def _rate(per_s: float) -> str:
    """A rate with the digits that matter: 329, 12.5, 0.25 (a rounded 0 would hide a slow trickle)."""
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.3g}"
