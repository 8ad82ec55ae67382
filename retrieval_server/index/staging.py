"""Index directories written all at once: a build or import that fails leaves ``--out`` as it was.

``staged(out)`` gives the command a fresh directory beside ``out`` (``.NAME.staging-XXXX``, same file system) to
write the whole index into. Only when the command's work has finished without an error are its entries moved into
``out``: first the old manifests go (the old index stops being served while files change), then every file and
directory (``faiss.index``, ``bm25/``, ``shard-i/``) replaces its namesake by a rename, then the new
``manifest.json`` last. On an error the staging directory is deleted and ``out`` is untouched, byte for byte. A
server that still maps an old file keeps reading it (a rename never changes an open file). A command killed with
SIGKILL leaves its staging directory behind (hidden, beside ``out``; delete it), never a half-written ``out``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from retrieval_server.index.manifest import MANIFEST_NAME
from retrieval_server.index.shards import SHARD_DIR, clear_shard_manifests


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A new directory beside ``out`` to write into; moved into ``out`` when the block ends without an error,
    deleted (``out`` untouched) when it raises."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    publish(stage, out)


def publish(stage: Path, out: Path) -> None:
    """Move every entry of ``stage`` into ``out`` (replacing its namesakes), the manifest last; remove ``stage``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    if any(stage.glob(SHARD_DIR.format("*"))):  # the shards of an earlier build stop being served too
        clear_shard_manifests(out)
    for entry in sorted(stage.iterdir()):
        if entry.name != MANIFEST_NAME:
            _replace(entry, out / entry.name)
    if (stage / MANIFEST_NAME).exists():
        os.replace(stage / MANIFEST_NAME, out / MANIFEST_NAME)
    shutil.rmtree(stage)


def _replace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` (file or directory) is renamed aside first, then deleted."""
    if src.is_file() and (dst.is_file() or not dst.exists()):
        os.replace(src, dst)
        return
    aside = dst.with_name(f".{dst.name}.replaced-{os.getpid()}")
    if dst.exists():
        os.replace(dst, aside)
    os.replace(src, dst)
    if aside.is_dir():
        shutil.rmtree(aside)
    elif aside.exists():
        aside.unlink()
