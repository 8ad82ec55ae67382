"""The HF rollout engine on CUDA, through its public ``generate``: greedy and sampled, seeded and unseeded, per-row
seeds, log-probs, stop strings and rows leaving the batch, compared with the same calls on the CPU where the
numbers must agree (greedy tokens, raw log-probs). Issue 56: every call that asked for log-probs failed at its first
sampled token on a GPU ("index is on cpu"), and nothing that ran on every commit could see it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.gpu.gpu_helpers import DEVICE, forward_widths
from tests.verl.workers.rollout.rollout_helpers import raw_logprobs
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

pytestmark = pytest.mark.gpu

STOPS = ["</search>", "</answer>"]


@pytest.fixture(scope="module")
def engine(model_dir) -> HFRollout:
    """The engine on the device as the trainer builds it there (the static cache, its decode step a CUDA graph),
    float32 (so its greedy tokens and log-probs can be compared with the CPU's); micro-batches of 8 rows hold all five
    prompts."""
    return HFRollout(str(model_dir), device=DEVICE, micro_batch_size=8, seed=0)


@pytest.fixture(scope="module")
def dynamic_engine(model_dir) -> HFRollout:
    """The engine on the device with the dynamic cache (``rollout.hf_kv_cache=dynamic``): rows that end leave."""
    return HFRollout(str(model_dir), device=DEVICE, micro_batch_size=8, seed=0, kv_cache="dynamic")


@pytest.fixture(scope="module")
def cpu_engine(model_dir) -> HFRollout:
    return HFRollout(str(model_dir), device="cpu", micro_batch_size=8, seed=0)


def test_greedy_with_stops_and_log_probs_equals_the_cpu(engine, cpu_engine, prompts, tokenizer):
    """Guards against the device path generating other tokens than the CPU path (a sampler, stop check or row index
    on the wrong device; a batch that loses track of its rows as they leave): greedy tokens, finish reasons, stop
    strings and raw log-probs must equal the CPU engine's, with some rows stopped by a stop string and some by eos."""
    params = SamplingParams(max_tokens=40, temperature=0, stop=STOPS, logprobs=True)
    on_device, on_cpu = engine.generate(prompts, params), cpu_engine.generate(prompts, params)
    assert [o.token_ids for o in on_device] == [o.token_ids for o in on_cpu]
    assert [(o.finish_reason, o.stop_str) for o in on_device] == [(o.finish_reason, o.stop_str) for o in on_cpu]
    for mine, theirs in zip(on_device, on_cpu, strict=True):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-3)
    assert {o.stop_str for o in on_device} & set(STOPS) and any(o.stop_str is None for o in on_device)
    stopped = next(o for o in on_device if o.stop_str == "</search>")
    assert tokenizer.decode(stopped.token_ids).endswith("</search>")


def _one_at_a_time(engine: HFRollout, prompts: list[list[int]], params: SamplingParams,
                   seeds: list[int] | None = None) -> list:
    """Each prompt's outputs from a call of its own (with its own row seed, where ``seeds`` gives one a prompt)."""
    return [out for i, prompt in enumerate(prompts)
            for out in engine.generate([prompt], replace(params, row_seeds=None if seeds is None else [seeds[i]]))]


def test_rows_leave_the_batch_on_the_device(dynamic_engine, engine, prompts):
    """Guards the dynamic cache's decode loop on the device (ended rows dropped from the batch and its KV cache): the
    forward passes narrow as rows end, and each row's tokens equal those of the row generated alone, and the static
    cache's (with its CUDA graph)."""
    params = SamplingParams(max_tokens=40, temperature=0, stop=STOPS)
    with forward_widths(dynamic_engine.model) as widths:
        together = dynamic_engine.generate(prompts, params)
    assert widths[0] == len(prompts) and widths[-1] < len(prompts) and widths == sorted(widths, reverse=True)
    assert [o.token_ids for o in together] == [o.token_ids for o in _one_at_a_time(dynamic_engine, prompts, params)]
    assert [o.token_ids for o in together] == [o.token_ids for o in engine.generate(prompts, params)]


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a CUDA device")
def test_the_decode_step_is_a_cuda_graph_that_sees_synced_weights(engine, prompts, state_dict):
    """Guards the GPU engine's speed path: the static cache's decode step is captured as a CUDA graph (no fallback to
    eager steps: nothing in the step syncs with the host), a second call of the same shape replays it (one forward:
    the prompt pass; the steps are replays), and weights synced in place reach the replayed graph (greedy tokens
    change with other weights and come back with the old ones)."""
    params = SamplingParams(max_tokens=16, temperature=0, stop=STOPS)
    first = engine.generate(prompts, params)
    graph = engine._static_kv.graph
    assert graph is not None and graph.graph is not None and not graph.failed
    with forward_widths(engine.model) as widths:
        assert [o.token_ids for o in engine.generate(prompts, params)] == [o.token_ids for o in first]
    assert len(widths) == 1 and engine._static_kv.graph is graph  # the prompt pass only; the decode steps replayed
    other = {name: -t for name, t in state_dict.items()}
    engine.sync_weights(other.items())
    assert [o.token_ids for o in engine.generate(prompts, params)] != [o.token_ids for o in first]
    engine.sync_weights(state_dict.items())
    assert [o.token_ids for o in engine.generate(prompts, params)] == [o.token_ids for o in first]


def test_sampled_log_probs_are_the_models_raw_log_probs(engine, hf_model, prompts):
    """Guards against sampled log-probs on the device read at the wrong step, after temperature / top-k / top-p, or
    for the wrong token: each must be the raw log-softmax of its token, recomputed here on the CPU model."""
    params = SamplingParams(max_tokens=12, temperature=0.7, top_k=20, top_p=0.9, logprobs=True, seed=3)
    for prompt, out in zip(prompts[:3], engine.generate(prompts[:3], params), strict=True):
        assert len(out.logprobs) == len(out.token_ids) > 0
        assert out.logprobs == pytest.approx(raw_logprobs(hf_model, prompt, out.token_ids), abs=1e-3)


def test_seeded_calls_reproduce_unseeded_differ_and_rngs_are_left_alone(engine, prompts):
    """Guards the seeds on the device: a call seed reproduces its tokens and another seed changes them, calls without
    one differ, and neither the CPU nor the CUDA global generator is reseeded by a call (the trainer's own draws
    would follow the rollout seed)."""
    params = SamplingParams(max_tokens=8, temperature=1.0, n=2, seed=7, logprobs=True)
    cpu_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state() if DEVICE == "cuda" else None
    first = engine.generate(prompts, params)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    if cuda_state is not None:
        assert torch.equal(torch.cuda.get_rng_state(), cuda_state)
    assert [o.token_ids for o in engine.generate(prompts, params)] == [o.token_ids for o in first]
    assert [o.token_ids for o in engine.generate(prompts, replace(params, seed=8))] != [o.token_ids for o in first]
    unseeded = [engine.generate(prompts, replace(params, seed=None)) for _ in range(2)]
    assert [o.token_ids for o in unseeded[0]] != [o.token_ids for o in unseeded[1]]


def test_row_seeds_make_a_row_independent_of_its_batch(engine, prompts):
    """Guards per-row sampling on the device (the asynchronous agent loop's): a prompt's samples, with their
    log-probs, are the same generated alone as in a batch whose other rows end at other steps."""
    params = SamplingParams(max_tokens=24, temperature=1.5, top_p=0.95, n=2, stop=STOPS, logprobs=True)
    seeds = [101 + 7 * i for i in range(len(prompts))]
    together = engine.generate(prompts, replace(params, row_seeds=seeds))
    alone = _one_at_a_time(engine, prompts, params, seeds)
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert [o.logprobs for o in together] == [pytest.approx(o.logprobs, abs=1e-4) for o in alone]
    assert len({len(o.token_ids) for o in together}) > 1


def test_a_bfloat16_engine_samples_with_close_log_probs(model_dir, hf_model, prompts):
    """Guards the engine in bfloat16 on the device (what GPU runs use, ``rollout.dtype=bfloat16``): it samples with
    stop strings and log-probs, and each log-prob is within bfloat16 rounding of the float32 model's."""
    engine = HFRollout(str(model_dir), dtype="bfloat16", device=DEVICE, micro_batch_size=8, seed=0)
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    outputs = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=1.0, stop=STOPS, logprobs=True,
                                                      seed=5))
    for prompt, out in zip(prompts, outputs, strict=True):
        assert 0 < len(out.token_ids) <= 16 and len(out.logprobs) == len(out.token_ids)
        assert out.logprobs == pytest.approx(raw_logprobs(hf_model, prompt, out.token_ids), rel=0.05, abs=0.1)
