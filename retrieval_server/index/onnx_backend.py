"""ONNX Runtime backend of the query encoder, for CPUs: same fp32 embeddings, far less time per small batch, and a
service start that needs neither torch nor sentence-transformers once the model was exported.

Why: eager PyTorch spends most of a small batch's time in per-operator overhead and in GEMMs of a few rows, which
ONNX Runtime largely avoids, so it is faster on small batches. It runs the same fp32 graph with fused attention,
GELU and layer norms, so the embeddings equal PyTorch's to float rounding (cosine >= ``MIN_COSINE``) and no
top-1 passage moves. At large batches both are bound by the same fp32 GEMMs and run at about the same rate
(``benchmarks/bench_retrieval.py``). Lower precision does not help there on a CPU without VNNI: int8 ONNX
Runtime was faster than fp32 but moved the top-1 passage of too many of the benchmark's queries. Measured
figures: docs/results.md.

How:
- The whole encoder is one graph, token ids in, sentence embedding out: the model's first module (the Hugging Face
  transformer) and the model's own modules after it (pooling, normalisation, any dense head), traced from the loaded
  sentence-transformers model (``torch.onnx.export``, dynamo, dynamic batch and sequence axes). So any
  sentence-transformers model whose first module is a ``Transformer`` works, and pooling stays exactly the model's.
- A bundle per model, in ``cache_dir()/KEY/``: ``encoder.onnx``; ``tokenizer.json``, the model's own fast tokenizer
  with its truncation length and padding set; ``bundle.json``, the graph's inputs, the embedding size and torch's fp32
  embedding of the probe sentence (no prefix), against which a load checks the graph. KEY hashes the model
  directory's files (names and bytes) with ONNX Runtime's version, so a start finds the bundle without loading the
  model (a model named on the hub, not a directory, is keyed by that probe embedding instead and always loaded with
  torch first).
- A start that finds its model's bundle (``load_bundle``) loads only ONNX Runtime and the ``tokenizers`` library: no
  torch, no sentence-transformers (their imports and the model's load were ~5 of a dense service's ~6 s of start-up
  on a CPU). Only where the export found that the tokenizer alone gives the model's own inputs for
  ``TOKENIZER_PROBES`` (empty, short, mixed case, accents, over-long); for a model where it does not, the bundle
  serves the torch start, which tokenizes with the model. A bundle whose graph no longer embeds the probe like torch
  did is made again. Served from a bundle, the encoder's fingerprint for the manifest check is the graph's own
  embedding of the (prefixed) probe, within float rounding of torch's.
- A bundle is written to a temporary directory and renamed, so concurrent servers never read half of one.
- Threads: as many as asked (``serve --threads``), else ONNX Runtime's default (the physical cores, as torch's); no
  spin-waiting after a batch, so an idle server does not take CPU from a trainer on the same machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# fp32 in both: float rounding only (measured figures: docs/results.md); a broken export is far below
MIN_COSINE = 0.9999
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
BUNDLE_FORMAT = 2  # 1: the transformer alone in <key>.onnx (pooling in torch); 2: this module's bundle directories
# Texts whose token ids the bundle's tokenizer must reproduce exactly for a torch-free start: empty, short, mixed case
# and punctuation, accents and symbols, leading and trailing spaces, and one past any model's truncation length.
TOKENIZER_PROBES = ("", "a", "Which RIVER flows through the capital, and who named it?",
                    "  naïve café: 1,766 °C — Ünï ", "iPhone vs. Android (2019)", "word " * 600)


def available() -> bool:
    """Whether ONNX Runtime (and the exporter's onnxscript) can be imported."""
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


def cache_dir() -> Path:
    """``$SEARCH_R1_CACHE`` or ``$XDG_CACHE_HOME/search_r1`` or ``~/.cache/search_r1``, then ``onnx/``."""
    root = os.environ.get("SEARCH_R1_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                     "search_r1")
    return Path(root) / "onnx"


def model_digest(model: str) -> str | None:
    """sha256 of a local model directory's files (relative names and bytes); None when ``model`` is not one."""
    root = Path(model)
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def bundle_dir(model: str, probe: np.ndarray | None = None) -> Path | None:
    """Where ``model``'s bundle lives: keyed by its directory's files, else (a hub name) by ``probe`` (its embedding of
    the probe sentence) and torch's version; None for a hub name without one (known only once torch loaded it)."""
    import onnxruntime

    material = model_digest(model)
    if material is None:
        if probe is None:
            return None
        import torch

        material = hashlib.sha256(np.ascontiguousarray(probe, dtype=np.float32).tobytes()).hexdigest()
        material += f" torch {torch.__version__}"
    key = hashlib.sha256(f"{material} onnxruntime {onnxruntime.__version__} bundle {BUNDLE_FORMAT}".encode())
    return cache_dir() / key.hexdigest()[:20]


def _tokenize_with(tokenizer, names: list[str], lower_case: bool, texts: list[str]) -> dict[str, np.ndarray]:
    """``[b]`` texts -> the graph's inputs ``[b, T]`` int64, by the ``tokenizers`` library alone."""
    encodings = tokenizer.encode_batch([t.lower() for t in texts] if lower_case else list(texts))
    fields = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
    return {name: np.asarray([getattr(e, fields[name]) for e in encodings], dtype=np.int64) for name in names}


def read_meta(directory: Path) -> dict:
    """A bundle's ``bundle.json``; ``RuntimeError`` when it is missing or unreadable."""
    try:
        return json.loads((directory / "bundle.json").read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"ONNX bundle {directory} cannot be loaded: {type(e).__name__}: {e}") from e


class OnnxEncoder:
    """A bundle's graph in ONNX Runtime: ``encode`` gives the model's sentence embeddings (not yet normalised).

    ``directory``: the bundle. It tokenizes with the bundle's own tokenizer (no torch) where that is exact, else with
    ``model_tokenize`` (texts -> the graph's inputs as int64 arrays; the loaded model's). Raises ``RuntimeError`` when
    the bundle is incomplete, ONNX Runtime cannot load it, or it has no exact tokenizer and none is given."""

    def __init__(self, directory: Path, threads: int = 0,
                 model_tokenize: Callable[[list[str]], dict[str, np.ndarray]] | None = None):
        import onnxruntime as ort

        self.directory = directory
        self.path = directory / "encoder.onnx"
        meta = read_meta(directory)
        try:
            self.names, self.dim = list(meta["inputs"]), int(meta["dim"])
            self.probe = np.asarray(meta["probe"], dtype=np.float32)  # [dim]: torch fp32, at export, no prefix
            self.exact_tokenizer = bool(meta["exact_tokenizer"])
            if self.exact_tokenizer:
                from tokenizers import Tokenizer

                tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
                self._tokenize = lambda texts: _tokenize_with(tokenizer, self.names, meta["lower_case"], texts)
            elif model_tokenize is not None:
                self._tokenize = model_tokenize
            else:
                raise ValueError("its tokenizer does not give the model's inputs: only the loaded model can tokenize")
            options = ort.SessionOptions()
            options.intra_op_num_threads = max(threads, 0)  # 0: ONNX Runtime's default, the physical cores
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # a missing or damaged file, ONNX Runtime's own exception types
            raise RuntimeError(f"ONNX bundle {directory} cannot be loaded: {type(e).__name__}: {e}") from e

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """``[N]`` texts -> ``[N, dim]`` float32 embeddings as the model's last module gives them. Texts are sorted
        by length and run ``batch_size`` at a time, so a batch pads to similar lengths."""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            rows = order[start:start + batch_size]
            inputs = self._tokenize([texts[i] for i in rows])  # [b, T] int64 each
            out[rows] = self.session.run(None, {k: inputs[k] for k in self.names})[0]  # [b, dim]
        return out

    def probe_cosine(self, probe_text: str) -> float:
        """Cosine of this graph's embedding of ``probe_text`` (the probe sentence) with torch's, recorded at export."""
        vector = self.encode([probe_text], 1)[0]
        return float(vector @ self.probe / (np.linalg.norm(vector) * np.linalg.norm(self.probe) + 1e-12))


def load_bundle(model: str, probe_text: str, threads: int = 0) -> OnnxEncoder | None:
    """``model``'s bundle, torch-free, when one was exported for a local model directory with an exact tokenizer and
    still embeds ``probe_text`` (the probe sentence) as torch did; else None (the caller loads the model with torch,
    which makes the bundle again where it is broken). Needs only ``onnxruntime`` and ``tokenizers``."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    directory = bundle_dir(model)
    if directory is None or not (directory / "bundle.json").is_file():
        return None
    try:
        if not read_meta(directory).get("exact_tokenizer"):
            return None
        encoder = OnnxEncoder(directory, threads)
    except RuntimeError as e:
        logger.warning("%s: loading the model with torch, which makes it again", e)
        return None
    cosine = encoder.probe_cosine(probe_text)
    if not cosine >= MIN_COSINE:
        logger.warning("the ONNX bundle %s embeds the probe at cosine %.6f of torch's (< %s): loading the "
                       "model with torch, which makes it again", directory, cosine, MIN_COSINE)
        return None
    return encoder


def _pipeline(model, names: list[str]):
    """A torch module running ``model`` (a SentenceTransformer) from its inputs ``names`` to its sentence embedding:
    the transformer, then every later module on the features it leaves."""
    from torch import nn

    transformer = getattr(model[0], "auto_model", None)
    if transformer is None:
        raise RuntimeError(f"the model's first module is {type(model[0]).__name__}, not a transformer")

    class Pipeline(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = transformer
            self.tail = nn.ModuleList(list(model)[1:])

        def forward(self, input_ids, attention_mask, token_type_ids=None):  # [b, T] each
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            features = {k: given[k] for k in names}
            features["token_embeddings"] = self.transformer(**features).last_hidden_state  # [b, T, hidden]
            for module in self.tail:
                features = module(features)
            return features["sentence_embedding"]  # [b, dim]

    return Pipeline().eval()


def _export(module, sample: dict, names: list[str], path: Path) -> None:
    """``module`` (inputs ``names``, as ``sample`` holds them) -> the ONNX file ``path``."""
    import torch

    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    quiet = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:  # the exporter logs every pass and prints its progress
            q.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), torch.inference_mode(False), \
                torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, tuple(sample[k] for k in names), str(path), input_names=names,
                              output_names=["sentence_embedding"],
                              dynamic_shapes={k: {0: batch, 1: seq} for k in names}, dynamo=True, optimize=True,
                              external_data=False)
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


def _tokenizer_file(model, names: list[str], preprocess) -> tuple[str, bool, bool]:
    """The model's fast tokenizer with its truncation and padding set, as JSON; whether the model lower-cases; whether
    that tokenizer alone gives the model's own inputs for ``TOKENIZER_PROBES`` (False where it cannot be made)."""
    from tokenizers import Tokenizer

    hf = getattr(model, "tokenizer", None)
    backend = getattr(hf, "backend_tokenizer", None)
    lower_case = bool(getattr(model[0], "do_lower_case", False))
    if backend is None:  # a slow (Python) tokenizer: only the model can tokenize
        return "", lower_case, False
    tokenizer = Tokenizer.from_str(backend.to_str())
    tokenizer.enable_truncation(max_length=int(model[0].max_seq_length), strategy="longest_first",
                                direction=getattr(hf, "truncation_side", "right"))
    tokenizer.enable_padding(pad_id=hf.pad_token_id or 0, pad_token=hf.pad_token or "[PAD]",
                             pad_type_id=getattr(hf, "pad_token_type_id", 0), direction=hf.padding_side)
    want = preprocess(list(TOKENIZER_PROBES))
    got = _tokenize_with(tokenizer, names, lower_case, list(TOKENIZER_PROBES))
    exact = all(np.array_equal(got[k], want[k].numpy()) for k in names)
    return tokenizer.to_str(), lower_case, exact


def export_bundle(model, probe: np.ndarray, directory: Path) -> None:
    """Export ``model`` (a SentenceTransformer in fp32 on the CPU, whose fp32 embedding of the probe is ``probe``) into
    the bundle ``directory``, written under a temporary name and renamed. Raises ``RuntimeError`` when it cannot be
    exported (its first module is not a transformer, the exporter fails, the cache directory cannot be written)."""
    preprocess = getattr(model, "preprocess", None) or model.tokenize  # sentence-transformers >= 6 / older
    sample = preprocess(["a short query", "a somewhat longer query about a river"])
    names = [k for k in INPUT_NAMES if k in sample]
    module = _pipeline(model, names)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=directory.parent))
        tmp.chmod(0o755)  # as a directory made by mkdir (mkdtemp's is private)
    except OSError as e:
        raise RuntimeError(f"ONNX export of the encoder failed: cannot write {directory.parent}: {e}") from e
    try:
        try:
            _export(module, sample, names, tmp / "encoder.onnx")
        except Exception as e:  # the exporter raises many kinds; the message says which
            raise RuntimeError(f"ONNX export of the encoder failed: {type(e).__name__}: {e}") from e
        tokenizer_json, lower_case, exact = _tokenizer_file(model, names, preprocess)
        (tmp / "tokenizer.json").write_text(tokenizer_json)
        (tmp / "bundle.json").write_text(json.dumps({
            "format": BUNDLE_FORMAT, "inputs": names, "dim": int(probe.shape[0]), "lower_case": lower_case,
            "exact_tokenizer": exact, "probe": [float(x) for x in probe]}))
        try:
            os.replace(tmp, directory)
        except OSError as e:  # another process renamed its bundle there first: the same model's, so keep that one
            if not (directory / "bundle.json").is_file():
                raise RuntimeError(f"ONNX export of the encoder failed: cannot write {directory}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for legacy in directory.parent.glob("*.onnx"):  # format 1's graphs (the transformer alone), ~90 MB each
        legacy.unlink(missing_ok=True)


def open_or_export(model, name: str, probe: np.ndarray, probe_text: str, threads: int = 0) -> OnnxEncoder:
    """The bundle of ``model`` (a loaded SentenceTransformer named ``name``, whose fp32 embedding of ``probe_text``,
    without prefix, is ``probe``), exported first when missing, or again when the cached one does not load or does not
    embed the probe as torch did; it tokenizes with the bundle's tokenizer where that is exact, else with the model."""
    preprocess = getattr(model, "preprocess", None) or model.tokenize

    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in preprocess(texts).items() if k in INPUT_NAMES}

    directory = bundle_dir(name, probe)
    for attempt in range(2):  # a cached bundle that does not load (another ONNX Runtime's, damaged) is made again
        if not (directory / "bundle.json").is_file():
            logger.info("exporting the encoder to ONNX (once per model): %s", directory)
            shutil.rmtree(directory, ignore_errors=True)  # what is there is not a bundle (a rename is all or nothing)
            export_bundle(model, probe, directory)
        try:
            encoder = OnnxEncoder(directory, threads, tokenize)
            cosine = encoder.probe_cosine(probe_text)
            if not cosine >= MIN_COSINE:
                raise RuntimeError(f"ONNX bundle {directory} embeds the probe at cosine {cosine:.6f} of torch's "
                                   f"(< {MIN_COSINE})")
            return encoder
        except RuntimeError as e:
            if attempt:
                raise
            logger.warning("%s: exporting it again", e)
            shutil.rmtree(directory, ignore_errors=True)
    raise AssertionError("unreachable")
