"""ONNX Runtime backend of the query encoder, for CPUs: same fp32 embeddings, far less time per small batch.

Why: eager PyTorch spends most of a small batch's time in per-operator overhead and in GEMMs of a few rows, which
ONNX Runtime largely avoids, so it is faster on small batches. It runs the same fp32 graph with fused attention,
GELU and layer norms, so the embeddings equal PyTorch's to float rounding (cosine >= ``MIN_COSINE``) and no
top-1 passage moves. At large batches both are bound by the same fp32 GEMMs and run at about the same rate
(``benchmarks/bench_retrieval.py``). Lower precision does not help there on a CPU without VNNI: int8 ONNX
Runtime was faster than fp32 but moved the top-1 passage of too many of the benchmark's queries. Measured
figures: docs/results.md.

How:
- Only the model's first module (the Hugging Face transformer) runs in ONNX Runtime; the modules after it
  (pooling, normalisation, any dense head) stay the model's own torch modules, fed the exported model's
  ``last_hidden_state`` as ``token_embeddings``. So any sentence-transformers model whose first module is a
  ``Transformer`` works, and pooling stays exactly the model's.
- The export (``torch.onnx.export``, dynamic batch and sequence axes) runs once per model and is cached in
  ``cache_dir()`` under a key made of the model's fp32 fingerprint, torch's and ONNX Runtime's versions, written
  to a temporary name and renamed, so concurrent servers never read half a file.
- Threads: as many as torch uses (``serve --threads``); no spin-waiting after a batch, so an idle server does
  not take CPU from a trainer on the same machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# fp32 in both: float rounding only (measured figures: docs/results.md); a broken export is far below
MIN_COSINE = 0.9999
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


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


def _cache_key(fingerprint: np.ndarray) -> str:
    import onnxruntime
    import torch

    digest = hashlib.sha256(np.ascontiguousarray(fingerprint, dtype=np.float32).tobytes())
    digest.update(f"torch {torch.__version__} onnxruntime {onnxruntime.__version__}".encode())
    return digest.hexdigest()[:20]


def _export(transformer, features: dict, names: list[str], path: Path) -> None:
    """``transformer`` (an HF model returning ``last_hidden_state``) -> ONNX file at ``path``, atomically."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    quiet = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:  # the exporter logs every pass and prints its progress
            q.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(transformer, tuple(features[k] for k in names), tmp, input_names=names,
                              output_names=["last_hidden_state"], dynamic_shapes={k: {0: batch, 1: seq} for k in names},
                              dynamo=True, optimize=True, external_data=False)
        os.replace(tmp, path)
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
        if os.path.exists(tmp):
            os.unlink(tmp)


class OnnxTransformer:
    """Runs a SentenceTransformer's modules with its first (the transformer) in ONNX Runtime.

    ``model``: a ``SentenceTransformer`` in fp32 on the CPU; ``fingerprint``: its fp32 probe embedding (the cache
    key). Raises ``RuntimeError`` when the model cannot be exported or its first module is not a transformer.
    """

    def __init__(self, model, fingerprint: np.ndarray, threads: int = 0):
        import onnxruntime as ort
        import torch

        first = model[0]
        transformer = getattr(first, "auto_model", None)
        if transformer is None:
            raise RuntimeError(f"the model's first module is {type(first).__name__}, not a transformer")
        self.model = model
        self._preprocess = getattr(model, "preprocess", None) or model.tokenize  # sentence-transformers >= 6 / older
        sample = self._preprocess(["a short query", "a somewhat longer query about a river"])
        self.names = [k for k in INPUT_NAMES if k in sample]
        self.path = cache_dir() / f"{_cache_key(fingerprint)}.onnx"
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for attempt in range(2):  # a cached file that does not load (e.g. another ONNX Runtime's) is made again
            if not self.path.exists():
                logger.info("exporting the encoder to ONNX (once per model): %s", self.path)
                try:
                    with torch.inference_mode(False), torch.no_grad():
                        _export(transformer.eval(), sample, self.names, self.path)
                except Exception as e:  # the exporter raises many kinds; the message says which
                    raise RuntimeError(f"ONNX export of the encoder failed: {type(e).__name__}: {e}") from e
            try:
                self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
                break
            except Exception as e:  # ONNX Runtime's own exception types
                if attempt:
                    raise RuntimeError(f"ONNX Runtime cannot load {self.path}: {e}") from e
                logger.warning("ONNX Runtime cannot load the cached %s (%s): exporting it again", self.path, e)
                self.path.unlink(missing_ok=True)

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """``[N]`` texts -> ``[N, dim]`` embeddings as the model's last module gives them (not yet normalised),
        float32. Texts are sorted by length and run ``batch_size`` at a time, so a batch pads to similar lengths."""
        import torch

        order = np.argsort([-len(t) for t in texts], kind="stable")
        out: np.ndarray | None = None
        for start in range(0, len(texts), batch_size):
            rows = order[start:start + batch_size]
            features = self._preprocess([texts[i] for i in rows])  # input ids, masks: [b, T] int64
            hidden = self.session.run(None, {k: features[k].numpy() for k in self.names})[0]  # [b, T, hidden]
            features = dict(features, token_embeddings=torch.from_numpy(hidden))
            with torch.inference_mode():
                for module in list(self.model)[1:]:
                    features = module(features)
            vectors = features["sentence_embedding"].float().numpy()  # [b, dim]
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[rows] = vectors
        return out if out is not None else np.empty((0, self.model.get_embedding_dimension()), dtype=np.float32)
