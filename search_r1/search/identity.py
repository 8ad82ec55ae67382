"""What a run searched: the retrieval service's ``/health`` identity, recorded in the run directory.

At start-up the search recipe writes ``retrieval.json`` into ``trainer.default_local_dir``: the URL and the
identity of what it serves (corpus SHA-256 and passages, retriever, index kind, encoder, probe hash, measured
recall), and where the service found it (the corpus file, the index directory and the index's kind: ``bm25``, a
FAISS kind or ``online``), so that a user with several corpora need not match hashes by hand. A resumed run
compares the service it now reaches with that record: another corpus is a ``RunDirError`` naming both (exit 2),
another retriever, index or encoder over the same corpus a warning; the paths are not compared. The run directory's
``retriever.url`` may change between the two (a restarted service on another port); what it serves may not.

A service whose corpus is the embedded demo's while the training data is not the demo's is a warning at start: the
likely cause is another user's demo service on the default port 8000.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from verl.utils.run_dir import RunDirError

logger = logging.getLogger(__name__)

RECORD_FILE = "retrieval.json"
# The fields of /health that say what is searched (docs/design.md, "Retrieval API and corpus format"), then where it
# lies on the service's machine (recorded, never compared: a corpus moved or copied is the same corpus).
IDENTITY_KEYS = ("corpus_sha256", "passages", "retriever", "index", "model", "probe_sha256", "recall")
LOCATION_KEYS = ("corpus_path", "index_path", "index_kind")
# The SHA-256 of data_prep.demo_kb's corpus.jsonl at its default seed (what `make demo` serves); checked against the
# generator by tests/search_r1/search/test_identity.py.
DEMO_CORPUS_SHA256 = "e91daa560cd873e92c62ff060c23c277a973b366514a6aa89b7771191a2a4a9c"
DEMO_SOURCE_PREFIX = "demo_"  # data_source of the demo's questions (demo_single, demo_multi)


def identity(health: dict) -> dict:
    """The identity and location fields of a /health answer (None where the service does not report one)."""
    return {key: health.get(key) for key in IDENTITY_KEYS + LOCATION_KEYS}


def _describe(record: dict) -> str:
    what = f"corpus sha256 {str(record.get('corpus_sha256'))[:12]}.. ({record.get('passages')} passages)"
    return what + f", {record.get('retriever')} {record.get('index')}" + (
        f" with {record['model']}" if record.get("model") else "")


def record_retrieval(run_dir: Path, url: str, health: dict, resuming: bool) -> None:
    """Write ``run_dir/retrieval.json``; when ``resuming`` a run that recorded one, refuse another corpus first."""
    new = identity(health)
    path = run_dir / RECORD_FILE
    if resuming and path.exists():
        old = json.loads(path.read_text())
        if old.get("corpus_sha256") != new["corpus_sha256"]:
            raise RunDirError(
                f"{run_dir} was trained searching {_describe(old)} at {old.get('url')}, but the service at {url} "
                f"serves {_describe(new)}: a resumed run must search the corpus it started with. Start the service "
                "over that corpus (its index's manifest names it), or train in another directory "
                "(trainer.experiment_name=NAME)")
        changed = [key for key in ("retriever", "index", "model", "probe_sha256") if old.get(key) != new.get(key)]
        if changed:
            logger.warning("resuming %s over the same corpus but another %s: it was trained with %s, the service at "
                           "%s serves %s", run_dir, ", ".join(changed), _describe(old), url, _describe(new))
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"url": url, **new}, indent=2) + "\n")


def warn_if_demo_corpus(health: dict, url: str, data_sources: set[str]) -> bool:
    """Warn when the service serves the demo's corpus but the data is not the demo's; True when it warned."""
    if health.get("corpus_sha256") != DEMO_CORPUS_SHA256:
        return False
    foreign = sorted(s for s in data_sources if not s.startswith(DEMO_SOURCE_PREFIX))
    if not foreign:
        return False
    logger.warning("the retrieval service at %s serves the embedded demo's corpus (%s passages), but the data's "
                   "sources are %s: is this another run's demo service on that port? Start your own service and "
                   "pass its retriever.url", url, health.get("passages"), ", ".join(foreign[:5]))
    return True
