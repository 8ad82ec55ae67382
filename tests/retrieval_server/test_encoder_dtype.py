"""Half-precision query encoder: agrees with fp32 at top-1, is still recognised by the manifest check, and
``auto`` / refusals follow the device (bf16 on CPU runs here; fp16/bf16 on GPU only where a GPU is present).

The GPU test needs neither FAISS nor this directory's fixtures (``pytest --noconftest -m gpu`` runs it on a
machine with torch and sentence-transformers only): it searches exactly with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrieval_server.index.encoder import DEFAULT_MODEL, Encoder, EncoderError
from tests.retrieval_server.retrieval_test_corpus import PASSAGES

QUERIES = ["Which river flows into the Sallow Sea?", "who made glass in Kelbrook", "cheese aged in caves",
           "a telescope made of brass", "folk songs about ferrymen", "who built the stone arches",
           "a green sky for eleven nights", "the ship wrecked near Dunmere", "a plant burned to make glass",
           "the quixotrian clock", "where do marsh herons nest", "which college teaches astronomy"]


def _top1_and_vectors(flat_index, dtype: str):
    from retrieval_server.index.manifest import Manifest  # not at module level: the GPU test runs without FAISS
    from retrieval_server.search.service import ServeOptions, load_retriever

    retriever = load_retriever(flat_index, Manifest.load(flat_index), ServeOptions(threads=1, encoder_dtype=dtype))
    _, rows = retriever.search(QUERIES, 1)
    return retriever.encoder, rows[:, 0].tolist(), retriever.encoder.encode_queries(QUERIES)


def test_bf16_agrees_with_fp32_at_top1_and_passes_the_manifest_check(flat_index):
    """Guards against a half-precision encoder that changes which passage comes first, that is refused by the
    manifest's fp32 fingerprint check, or that silently stays in fp32."""
    fp32, top1_fp32, vectors_fp32 = _top1_and_vectors(flat_index, "fp32")
    bf16, top1_bf16, vectors_bf16 = _top1_and_vectors(flat_index, "bf16")  # load_retriever checks the manifest
    assert (fp32.dtype, bf16.dtype) == ("fp32", "bf16")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    assert vectors_bf16.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors_bf16, axis=1), 1.0, atol=1e-5)  # normalised in fp32
    assert (vectors_fp32 * vectors_bf16).sum(axis=1).min() >= 0.99
    assert top1_bf16 == top1_fp32
    # taken before the cast (a bf16 one is ~1e-4 off); fp32 may serve from the ONNX bundle: float rounding only
    np.testing.assert_allclose(bf16.fingerprint(), fp32.fingerprint(), atol=1e-6)


def test_auto_is_fp32_on_cpu_and_fp16_needs_a_gpu():
    """Guards against auto choosing bf16 on CPU (it changed the top-1 passage of 1.4% of the benchmark's queries,
    and without bf16 instructions it is emulated, many times slower), and against fp16 on CPU being accepted
    (PyTorch emulates it, far slower than fp32)."""
    if torch.cuda.is_available():
        pytest.skip("the CPU rules apply without a GPU")
    encoder = Encoder(DEFAULT_MODEL, dtype="auto")
    assert encoder.dtype == "fp32" and next(encoder.model.parameters()).dtype == torch.float32
    with pytest.raises(EncoderError, match="fp16 needs a GPU"):
        Encoder(DEFAULT_MODEL, dtype="fp16")
    with pytest.raises(ValueError, match="must be one of"):
        Encoder(DEFAULT_MODEL, dtype="int8")


def test_a_checkpoint_stored_in_fp16_is_served_in_fp32(tmp_path):
    """Guards against an fp16 checkpoint staying fp16 under --encoder-dtype fp32 (transformers keeps the stored
    dtype by default): slow on CPU, and the manifest's fp32 fingerprint would be an fp16 one."""
    from sentence_transformers import SentenceTransformer

    SentenceTransformer(DEFAULT_MODEL, device="cpu").half().save(str(tmp_path / "fp16"))
    encoder = Encoder(str(tmp_path / "fp16"), device="cpu", dtype="fp32")
    assert encoder.dtype == "fp32" and next(encoder.model.parameters()).dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_half_precision_agrees_with_fp32_at_top1():
    """Guards against fp16/bf16 on GPU changing the top passage, breaking the fp32 fingerprint the manifest
    check compares, or auto not picking fp16 on GPU."""
    contents = [f'"{title}"\n{text}' for _, title, text in PASSAGES]
    fp32 = Encoder(DEFAULT_MODEL, dtype="fp32")
    assert fp32.model.device.type == "cuda"
    passages = fp32.encode_passages(contents)  # [N, dim]
    reference = fp32.encode_queries(QUERIES)  # [Q, dim]
    for dtype in ("fp16", "bf16"):
        encoder = Encoder(DEFAULT_MODEL, dtype=dtype)
        assert encoder.dtype == dtype and next(encoder.model.parameters()).dtype == getattr(torch, {
            "fp16": "float16", "bf16": "bfloat16"}[dtype])
        vectors = encoder.encode_queries(QUERIES)
        assert (vectors @ passages.T).argmax(axis=1).tolist() == (reference @ passages.T).argmax(axis=1).tolist()
        assert (vectors * reference).sum(axis=1).min() >= 0.99
        np.testing.assert_allclose(encoder.fingerprint(), fp32.fingerprint(), atol=1e-6)
    assert Encoder(DEFAULT_MODEL, dtype="auto").dtype == "fp16"
