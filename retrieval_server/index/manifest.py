"""The manifest written next to every index: what it was built from, checked before serving.

Choices:
- The corpus is identified by its byte size (checked before the server binds its port, instantly)
  and its SHA-256 (checked while the server loads; see ``corpus.scan_corpus``).
- The encoder is identified by behaviour, not by name: the manifest stores the embedding of a fixed
  probe sentence, and the server re-encodes it with the encoder it loaded. The same model under
  another path passes; a different model (or prefix setting) fails, whatever its name.
- A FAISS index built elsewhere and imported (``import_index``) stays where it is: the manifest
  records its path and byte size (``index_file``, ``index_bytes``; the size is checked before the
  port is bound). Such a manifest is format version 2; a manifest of an index inside its own
  directory is still written as version 1, so servers of either version read it.
- Every refusal says which part does not match and how to rebuild.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from retrieval_server.index.corpus import CorpusScan

FORMAT_VERSION = 2  # the newest version this code reads and writes (see ``Manifest.save``)
READABLE_VERSIONS = (1, 2)
MANIFEST_NAME = "manifest.json"
INDEX_FILE = "faiss.index"  # a dense index's FAISS file inside its directory, unless ``index_file`` says otherwise
# Cosine between the stored and the recomputed probe embedding above which the encoders count as
# the same (leaves room for CPU/GPU and batch-size rounding differences, far below any other model).
PROBE_MIN_COSINE = 0.999
RETRIEVERS = ("dense", "bm25")


class ManifestError(RuntimeError):
    """The index directory has no usable manifest, or the manifest does not match what is served."""


@dataclass
class Manifest:
    """Contents of ``<index_dir>/manifest.json``."""

    retriever: str  # "dense" or "bm25"
    count: int  # passages indexed (= non-blank corpus lines)
    corpus_sha256: str
    corpus_bytes: int
    corpus_path: str  # the file it was built from (informational; the checksum is what is checked)
    model: str | None = None  # dense: sentence-transformers model path or name
    dim: int | None = None  # dense: embedding size
    index: str | None = None  # dense: a kind of kinds.INDEX_KINDS ("flat", "ivfpq", ...)
    query_prefix: str = ""  # dense: prepended to queries ("query: " for e5 models)
    passage_prefix: str = ""  # dense: prepended to passages ("passage: " for e5 models)
    index_params: dict = field(default_factory=dict)  # FAISS / BM25 parameters used
    format_version: int = FORMAT_VERSION
    probe: list[float] | None = None  # dense: fp32 embedding of encoder.PROBE_TEXT (encoder fingerprint)
    index_file: str | None = None  # dense, imported: absolute path of the FAISS file (None: <index_dir>/faiss.index)
    index_bytes: int | None = None  # dense, imported: byte size of that file

    def save(self, index_dir: str | Path) -> None:
        """Write the manifest (last step of a build: an index without one is incomplete)."""
        data = asdict(self)
        if self.index_file is None:  # nothing that needs version 2: readable by version-1 servers too
            del data["index_file"], data["index_bytes"]
            data["format_version"] = 1
        else:
            data["format_version"] = 2
        path = Path(index_dir) / MANIFEST_NAME
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)

    @property
    def shard(self) -> dict | None:
        """A shard's rows and set (``shards.py``): ``{"index", "of", "start", "end", "total", "set"}``; None: whole."""
        return self.index_params.get("shard")

    @property
    def corpus_count(self) -> int:
        """Passages of the corpus (``count`` is the rows of this index: fewer for a shard)."""
        return self.shard["total"] if self.shard else self.count

    def index_path(self, index_dir: str | Path) -> Path:
        """The FAISS file of a dense index."""
        return Path(self.index_file) if self.index_file else Path(index_dir) / INDEX_FILE

    @classmethod
    def load(cls, index_dir: str | Path) -> Manifest:
        path = Path(index_dir) / MANIFEST_NAME
        if not path.is_file():
            if any(Path(index_dir).glob(f"shard-*/{MANIFEST_NAME}")):
                raise ManifestError(f"{index_dir} holds the shards of an index: serve each {index_dir}/shard-i with "
                                    "its own server and give the client all their URLs")
            raise ManifestError(f"no {MANIFEST_NAME} in {index_dir}: the index is missing or its build did not finish; "
                                "build it with `python -m retrieval_server.build_index`")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ManifestError(f"{path} is not valid JSON ({e.msg})") from None
        known = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or data.get("format_version") not in READABLE_VERSIONS or set(data) - known:
            raise ManifestError(f"{path} is not a manifest of a version this server reads {READABLE_VERSIONS}; "
                                "rebuild the index")
        manifest = cls(**data)
        if manifest.retriever not in RETRIEVERS:
            raise ManifestError(f"{path}: retriever must be one of {RETRIEVERS}, got {manifest.retriever!r}")
        return manifest


def _rebuild_hint(manifest: Manifest, index_dir: str | Path, corpus: str | Path) -> str:
    if manifest.index_file:
        return (f"import the FAISS index of that corpus with `python -m retrieval_server.import_index --faiss FILE "
                f"--corpus {corpus} --model MODEL --out {index_dir}`")
    return (f"rebuild it with `python -m retrieval_server.build_index --corpus {corpus} --out {index_dir} "
            f"--retriever {manifest.retriever}`")


def check_corpus_size(manifest: Manifest, index_dir: str | Path, corpus: str | Path) -> None:
    """Cheap check (file size only) done before the server binds its port."""
    size = Path(corpus).stat().st_size
    if size != manifest.corpus_bytes:
        raise ManifestError(
            f"corpus mismatch: index {index_dir} was built from a corpus of {manifest.corpus_bytes} bytes "
            f"({manifest.corpus_path}), but {corpus} has {size} bytes; {_rebuild_hint(manifest, index_dir, corpus)}")


def check_index_file(manifest: Manifest, index_dir: str | Path) -> None:
    """Cheap check (existence, and size for an imported file) done before the server binds its port."""
    if manifest.retriever != "dense":
        return
    path = manifest.index_path(index_dir)
    if not path.is_file():
        raise ManifestError(f"FAISS index file {path} (named by {Path(index_dir) / MANIFEST_NAME}) not found")
    if manifest.index_bytes is not None and path.stat().st_size != manifest.index_bytes:
        raise ManifestError(
            f"index mismatch: {path} has {path.stat().st_size} bytes, but it had {manifest.index_bytes} when it was "
            f"imported into {index_dir}; re-run `python -m retrieval_server.import_index` for the new file")


def check_corpus(manifest: Manifest, index_dir: str | Path, scan: CorpusScan) -> None:
    """Full check: checksum and passage count of the scanned corpus equal the manifest's."""
    if scan.sha256 != manifest.corpus_sha256 or scan.count != manifest.corpus_count:
        raise ManifestError(
            f"corpus mismatch: index {index_dir} was built from {manifest.corpus_path} "
            f"(sha256 {manifest.corpus_sha256[:12]}..., {manifest.corpus_count} passages), but {scan.path} has "
            f"sha256 {scan.sha256[:12]}... and {scan.count} passages; {_rebuild_hint(manifest, index_dir, scan.path)}")


def check_encoder(manifest: Manifest, index_dir: str | Path, model: str, probe: np.ndarray) -> None:
    """The encoder ``model`` (whose probe embedding is ``probe`` [D]) is the one the index was built with."""
    stored = np.asarray(manifest.probe, dtype=np.float32)
    if probe.shape != stored.shape:
        raise ManifestError(
            f"encoder mismatch: index {index_dir} was built with encoder {manifest.model} (dim {manifest.dim}), "
            f"but encoder {model} gives dim {probe.shape[0]}; serve with --model {manifest.model} or rebuild the index")
    cosine = float(stored @ probe / (np.linalg.norm(stored) * np.linalg.norm(probe) + 1e-12))
    if cosine < PROBE_MIN_COSINE:
        raise ManifestError(
            f"encoder mismatch: index {index_dir} was built with encoder {manifest.model}, but encoder {model} "
            f"embeds the probe sentence differently (cosine {cosine:.4f} < {PROBE_MIN_COSINE}); "
            f"serve with --model {manifest.model} or rebuild the index")
