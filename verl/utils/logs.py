"""Console logging of the entry points: warnings and the run's own lines; libraries' chatter at debug level.

``LOGLEVEL`` (DEBUG, INFO, WARNING, ...) sets the level of everything when given. Without it the root level is
WARNING, so a run's console holds the start-up summary, one line per step, the trainer's own events (resumed,
checkpoint saved), warnings and errors; not the per-request HTTP lines of the retrieval client (httpx),
transformers' load reports (a critic's new value head reads as "score.weight MISSING") and progress bars (loading
weights, writing shards), FAISS's probes for optional CPU builds, or vLLM's engine start-up reports
(``VLLM_LOGGING_LEVEL``). Set before Ray starts, so Ray's worker processes inherit these settings through the
environment.
"""

from __future__ import annotations

import logging
import os
import sys

NOISY = ("httpx", "httpcore", "faiss.loader", "urllib3", "filelock", "transformers")


def setup_logging() -> None:
    level = os.environ.get("LOGLEVEL")
    logging.basicConfig(level=level or logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level is None:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' "Loading weights" bars too
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM's ~50 start-up lines (read at its import)
        for name in NOISY:
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("verl.trainer").setLevel(logging.INFO)  # the run's own events: resumed, checkpoint saved
        logging.getLogger("verl.single_controller").setLevel(logging.INFO)  # where the Ray workers were placed
        transformers = sys.modules.get("transformers")  # not imported yet: it reads the variables above when it is
        if transformers is not None:
            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
