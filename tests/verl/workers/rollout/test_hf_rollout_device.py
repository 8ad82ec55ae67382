"""The HF engine on a (pretend) accelerator: every sampling mode runs with the model on ``cuda`` and gives exactly
the host's tokens and log-probs (``tests/fake_cuda.py``: device tensors live in host memory, mixing them with host
tensors raises as CUDA does, and host syncs are counted).

Guards against: the sampler returning its tokens on the host and the log-prob gather mixing them with the logits on
``cuda:0`` ("Expected all tensors to be on the same device"), which failed every GPU run at its first token while
every CPU test passed; a decode loop that waits for the device more than once per token; and a static-cache decode
step that syncs with the host (which a CUDA graph cannot hold).
"""

from __future__ import annotations

import pytest
import torch

from tests.fake_cuda import fake_cuda
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

CASES = {
    "greedy": dict(temperature=0.0),
    "seeded": dict(temperature=1.0, seed=7),
    "unseeded": dict(temperature=1.0),
    "top_p_top_k": dict(temperature=0.9, top_p=0.8, top_k=20, seed=3),
    "row_seeds": dict(temperature=1.0, row_seeds=[11, 12, 13, 14, 15]),
}
MAX_TOKENS, MICRO_BATCH = 24, 8


def _run(model_dir, prompts, device: str, kv_cache: str, **kw):
    engine = HFRollout(str(model_dir), device=device, micro_batch_size=MICRO_BATCH, seed=5, kv_cache=kv_cache,
                       cuda_graphs=False)
    params = SamplingParams(max_tokens=MAX_TOKENS, n=2, stop=["</search>", "</answer>"], logprobs=True, **kw)
    return engine.generate(prompts, params)


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_on_a_device_matches_the_host(model_dir, prompts, case, kv_cache):
    """Each sampling mode and cache on the device: no device mix, the same tokens / log-probs / finish reasons as on
    the host, and at most one host sync a token (plus one a micro-batch for the log-probs) with the static cache;
    the dynamic cache adds transformers' own, one a forward (its padding-mask check)."""
    host = _run(model_dir, prompts, "cpu", kv_cache, **CASES[case])
    with fake_cuda() as fake:
        device = _run(model_dir, prompts, "cuda", kv_cache, **CASES[case])
    micro_batches = -(-len(host) // MICRO_BATCH)
    per_token = 1 if kv_cache == "static" else 2
    assert fake.syncs <= micro_batches * (per_token * MAX_TOKENS + 1)
    assert [o.token_ids for o in device] == [o.token_ids for o in host]
    assert [o.finish_reason for o in device] == [o.finish_reason for o in host]
    assert [o.stop_str for o in device] == [o.stop_str for o in host]
    for d, h in zip(device, host, strict=True):
        assert d.logprobs == pytest.approx(h.logprobs, abs=1e-6)


def test_static_cache_decodes_as_the_dynamic_one(model_dir, prompts):
    """The static cache (the GPU's) and the dynamic one (the CPU's) give the same greedy tokens and log-probs: the
    padded batch, the pre-sized cache and the fixed mask buffer change nothing a row sees."""
    outs = {kv: _run(model_dir, prompts, "cpu", kv, temperature=0.0) for kv in ("dynamic", "static")}
    assert [o.token_ids for o in outs["static"]] == [o.token_ids for o in outs["dynamic"]]
    assert "stop" in {o.finish_reason for o in outs["dynamic"]}  # rows ended early (and left the dynamic batch)
    for s, d in zip(outs["static"], outs["dynamic"], strict=True):
        assert s.logprobs == pytest.approx(d.logprobs, abs=1e-4)


def test_static_decode_step_never_waits_for_the_device(model_dir, prompts):
    """The static cache's decode step (what a CUDA graph captures) makes no host sync: a graph cannot hold one (the
    capture fails, and the engine falls back to eager steps)."""
    with fake_cuda() as fake:
        engine = HFRollout(str(model_dir), device="cuda", micro_batch_size=MICRO_BATCH, kv_cache="static",
                           cuda_graphs=False)
        ids, mask = engine._left_pad(prompts)
        kv = engine._kv(len(prompts), ids.shape[1] + 8)
        logits = kv.prefill(ids, mask)
        before = fake.syncs
        for _ in range(4):
            logits = kv.step(logits.argmax(-1))
        assert fake.syncs == before
    assert logits.shape[0] == len(prompts)


def test_a_failed_graph_capture_falls_back_to_eager_steps(model_dir, prompts, caplog):
    """Where the decode step cannot be captured (here: no CUDA runtime for the graph), the call still returns the
    right tokens, with one warning saying so, instead of failing the run."""
    host = _run(model_dir, prompts, "cpu", "static", temperature=0.0)
    with fake_cuda():
        engine = HFRollout(str(model_dir), device="cuda", micro_batch_size=MICRO_BATCH, kv_cache="static",
                           cuda_graphs=True)
        out = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, n=2, stop=["</search>", "</answer>"],
                                                      logprobs=True, temperature=0.0))
    assert [o.token_ids for o in out] == [o.token_ids for o in host]
    assert sum("could not be captured as a CUDA graph" in r.message for r in caplog.records) == 1
    assert torch.get_default_device().type == "cpu"


def test_free_cache_gives_the_static_cache_back_after_each_call(model_dir, prompts):
    """``rollout.free_cache_engine``: the static cache (held between calls for reuse, and through the training
    phases) is dropped after each call, so its memory goes back to training; without it the cache is kept."""
    for free, kept in ((True, False), (False, True)):
        engine = HFRollout(str(model_dir), micro_batch_size=MICRO_BATCH, kv_cache="static", cuda_graphs=False,
                           free_cache=free)
        engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0))
        assert (engine._static_kv is not None) == kept
