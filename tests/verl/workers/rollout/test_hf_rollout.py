"""Tests of ``verl.workers.rollout.hf_rollout``: batched ``generate`` against plain loops on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.verl.workers.rollout.rollout_helpers import greedy_loop, perturbed, raw_logprobs
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_decode import StopCheck, stop_candidates
from verl.workers.rollout.hf_rollout import HFRollout, truncate_at_stop

STOPS = ["</search>", "</answer>"]


@pytest.fixture(scope="module")
def engine(model_dir) -> HFRollout:
    """Micro-batches of 2 rows, so a call spans several ``generate`` calls with different paddings."""
    return HFRollout(str(model_dir), micro_batch_size=2, seed=0)


def test_batched_greedy_equals_unbatched_loop(engine, hf_model, tokenizer, prompts):
    """Guards against left padding shifting positions or leaking into attention, and against
    micro-batches coming back out of order: batched greedy must equal a one-prompt, no-cache loop."""
    outputs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0))
    assert len(outputs) == len(prompts)
    for prompt, out in zip(prompts, outputs, strict=True):
        expected = greedy_loop(hf_model, prompt, 24, tokenizer.eos_token_id)
        assert out.token_ids == expected
        ended_by_eos = expected[-1] == tokenizer.eos_token_id
        assert out.finish_reason == ("stop" if ended_by_eos else "length")
        assert out.stop_str is None


def test_logprobs_are_raw_logprobs_of_sampled_tokens(engine, hf_model, prompts):
    """Guards against returning log-probs after temperature/top-k (or of the wrong step): they must be
    the raw log-softmax of each sampled token, recomputed here one forward pass per token."""
    params = SamplingParams(max_tokens=12, temperature=0.7, top_k=20, top_p=0.9, logprobs=True, seed=3)
    outputs = engine.generate(prompts[:3], params)
    for prompt, out in zip(prompts[:3], outputs, strict=True):
        assert len(out.logprobs) == len(out.token_ids)
        expected = raw_logprobs(hf_model, prompt, out.token_ids)
        assert out.logprobs == pytest.approx(expected, abs=1e-4)


def test_stop_string_ends_its_row_only(engine, tokenizer, prompts):
    """Guards against one row's stop string ending (or truncating) the other rows of its micro-batch,
    and against tokens after the stop string (padding or further samples) leaking into token_ids."""
    outputs = engine.generate(prompts[:2], SamplingParams(max_tokens=40, temperature=0, stop=["</search>"]))
    stopped, other = outputs
    assert stopped.finish_reason == "stop" and stopped.stop_str == "</search>"
    assert tokenizer.decode(stopped.token_ids).endswith("</search>")
    assert stopped.token_ids[-1] == tokenizer.convert_tokens_to_ids("</search>")
    unstopped = engine.generate(prompts[1:2], SamplingParams(max_tokens=40, temperature=0))[0]
    assert other.token_ids == unstopped.token_ids  # its own stop: eos (no </search> in an <information> turn)
    assert "</search>" not in tokenizer.decode(other.token_ids)


def test_truncate_at_stop_matches_token_by_token_scan(tokenizer):
    """Guards the binary search of ``truncate_at_stop`` (off-by-one, multi-token stop strings, eos
    before/after a stop) against a plain scan that decodes every prefix."""
    gen = torch.Generator().manual_seed(0)
    eos = tokenizer.eos_token_id
    stops = ["</search>", "capital of", "e c"]
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    vocab = len(tokenizer)
    for _ in range(200):
        ids = torch.randint(vocab, (30,), generator=gen).tolist()
        expected = (ids, "length", None)
        for t in range(len(ids)):
            if ids[t] == eos:
                expected = (ids[:t + 1], "stop", None)
                break
            hits = [stop for stop in stops if stop in decode(ids[:t + 1])]
            if hits:
                expected = (ids[:t + 1], "stop", hits[0])
                break
        assert truncate_at_stop(ids, [eos], stops, decode) == expected


def test_n_samples_grouped_by_prompt(engine, prompts):
    """Guards against samples being interleaved across prompts (prompt-major order is the contract)
    and against max_tokens being exceeded."""
    greedy = engine.generate(prompts[:3], SamplingParams(max_tokens=6, temperature=0, n=3))
    singles = engine.generate(prompts[:3], SamplingParams(max_tokens=6, temperature=0))
    assert [o.token_ids for o in greedy] == [s.token_ids for s in singles for _ in range(3)]
    sampled = engine.generate(prompts[2:4], SamplingParams(max_tokens=5, temperature=1.0, n=4, seed=1))
    assert len(sampled) == 8
    for out in sampled:
        if out.finish_reason == "length":
            assert len(out.token_ids) == 5
        else:
            assert out.token_ids[-1] in engine.eos_ids and len(out.token_ids) <= 5


def test_seeds_reproduce_and_leave_global_rng_alone(engine, prompts):
    """Guards against per-call seeds being ignored, and against the engine reseeding the global torch
    RNG (which would silently correlate the trainer's own random draws with the rollout seed)."""
    params = SamplingParams(max_tokens=8, temperature=1.0, n=2, seed=7)
    torch.manual_seed(123)
    first = engine.generate(prompts, params)
    after_call = torch.rand(3)
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    assert torch.equal(after_call, expected_draw)
    assert [o.token_ids for o in engine.generate(prompts, params)] == [o.token_ids for o in first]
    other = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=1.0, n=2, seed=8))
    assert [o.token_ids for o in other] != [o.token_ids for o in first]
    unseeded = [engine.generate(prompts, SamplingParams(max_tokens=8, temperature=1.0)) for _ in range(2)]
    assert [o.token_ids for o in unseeded[0]] != [o.token_ids for o in unseeded[1]]


def test_sync_weights_in_place(engine, state_dict, prompts):
    """Guards against sync_weights not reaching the generating model (e.g. loading into a copy) and
    against silently ignoring misspelt names."""
    params = SamplingParams(max_tokens=16, temperature=0)
    before = [o.token_ids for o in engine.generate(prompts, params)]
    try:
        engine.sync_weights(perturbed(state_dict).items())
        assert [o.token_ids for o in engine.generate(prompts, params)] != before
        with pytest.raises(KeyError, match="no_such"):
            engine.sync_weights([("model.no_such.weight", torch.zeros(1))])
    finally:
        engine.sync_weights(state_dict.items())
    assert [o.token_ids for o in engine.generate(prompts, params)] == before


def _scan(ids: list[int], eos: int, stops: list[str], decode) -> tuple[list[int], str, str | None]:
    """Where a stop is hit, decoding every prefix in turn (the reference for ``truncate_at_stop``)."""
    for t in range(len(ids)):
        if ids[t] == eos:
            return ids[:t + 1], "stop", None
        hits = [stop for stop in stops if stop in decode(ids[:t + 1])]
        if hits:
            return ids[:t + 1], "stop", hits[0]
    return ids, "length", None


def test_truncate_at_stop_on_the_real_vocabulary(qwen_tokenizer):
    """Guards the binary search of ``truncate_at_stop`` on Qwen2.5's vocabulary, where stop strings span several
    tokens and end inside one (``>`` + newlines, `` capital``), and tokens may be partial UTF-8 characters: the
    cut must be the first token whose prefix text holds a stop, as a scan over every prefix finds it."""
    tok = qwen_tokenizer
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)
    stops = ["</search>", "capital of", "e c"]
    text = "<search> the capital of France </search>\n\n</search>. e c 東京 é"
    pool = tok(text, add_special_tokens=False)["input_ids"]
    gen = torch.Generator().manual_seed(0)
    inside = 0
    for _ in range(200):
        ids = [pool[i] for i in torch.randint(len(pool), (24,), generator=gen).tolist()]
        ids[int(torch.randint(24, (1,), generator=gen))] = int(torch.randint(len(tok), (1,), generator=gen))
        expected = _scan(ids, tok.eos_token_id, stops, decode)
        assert truncate_at_stop(ids, [tok.eos_token_id], stops, decode) == expected
        kept, _, stop = expected
        inside += stop is not None and not decode(kept).endswith(stop)  # the stop ended inside the last token
    assert inside > 10


def test_ended_rows_leave_the_batch(model_dir, prompts):
    """Guards the reason the engine has its own decode loop: rows that ended must stop costing a batch row (a
    batch that keeps its full width to its longest row is what made a demo-real step wait minutes), without
    changing any row's tokens: the forward passes' batch sizes must shrink as rows end, and each row's greedy
    tokens must equal those of the row generated alone."""
    engine = HFRollout(str(model_dir), micro_batch_size=len(prompts), seed=0)
    widths = []
    hook = engine.model.register_forward_pre_hook(lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[0]),
                                                  with_kwargs=True)
    params = SamplingParams(max_tokens=40, temperature=0, stop=STOPS)
    try:
        together = engine.generate(prompts, params)
    finally:
        hook.remove()
    lengths = sorted(len(out.token_ids) for out in together)
    assert lengths[0] < lengths[-1]  # rows end at different steps, else nothing could leave
    assert widths[0] == len(prompts) and widths == sorted(widths, reverse=True)
    # a step's batch holds the rows still running, plus fewer than a quarter of it that ended but were kept
    for step, width in enumerate(widths[1:], start=1):
        running = sum(length > step for length in lengths)
        assert running <= width and (width == running or 4 * (width - running) < width)
    assert widths[-1] < len(prompts)
    alone = [engine.generate([p], params)[0] for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert [o.finish_reason for o in together] == [o.finish_reason for o in alone]


def test_row_seeds_make_a_row_independent_of_its_batch(model_dir, prompts):
    """Guards per-row sampling (``row_seeds``, what the async agent loop relies on) against drawing from the wrong
    row's generator once ended rows leave the batch: a prompt's samples must be the same alone as in a batch."""
    params = SamplingParams(max_tokens=24, temperature=1.5, top_p=0.95, n=2, stop=STOPS, logprobs=True)
    seeds = [101 + 7 * i for i in range(len(prompts))]
    engine = HFRollout(str(model_dir), micro_batch_size=len(prompts) * 2, seed=0)
    together = engine.generate(prompts, replace(params, row_seeds=seeds))
    for i, prompt in enumerate(prompts):
        alone = engine.generate([prompt], replace(params, row_seeds=[seeds[i]]))
        assert [o.token_ids for o in together[2 * i:2 * i + 2]] == [o.token_ids for o in alone]
        for mixed, own in zip(together[2 * i:2 * i + 2], alone, strict=True):
            assert mixed.logprobs == pytest.approx(own.logprobs, abs=1e-4)
    assert len({len(o.token_ids) for o in together}) > 1


GENERATE_STREAM = """
import json, sys, torch
from transformers import AutoModelForCausalLM, GenerationConfig
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
prompts = json.loads(sys.argv[2])
engine = HFRollout(sys.argv[1], micro_batch_size=64, seed=0)
widths = []
engine.model.register_forward_pre_hook(lambda _, a, k: widths.append(k["input_ids"].shape[0]), with_kwargs=True)
for seed in range(4):
    outs = engine.generate(prompts, SamplingParams(max_tokens=40, temperature=1.0, n=3, seed=seed, logprobs=True))
    rows = [p for p in prompts for _ in range(3)]
    ids, mask = engine._left_pad(rows)
    torch.manual_seed(seed)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=40,
                              eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id)
    with torch.inference_mode():
        plain = engine.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    for out, row in zip(outs, plain[:, ids.shape[1]:].tolist()):
        eos = next((t + 1 for t, tok in enumerate(row) if tok in engine.eos_ids), len(row))
        assert out.token_ids == row[:eos], (seed, out.token_ids, row[:eos])
assert min(widths) < 3 * len(prompts), widths
print("same")
"""


def test_sampling_keeps_generates_random_stream_under_pinned_numerics(model_dir, prompts):
    """Guards the demo's figures (``make demo`` samples its rollouts this way, under ``configs/demo_numerics.env``):
    with a call seed and no row seeds, dropping ended rows must not change what the other rows draw, so the engine
    samples exactly the tokens ``model.generate`` samples from the same seed. Run in a subprocess, since the pinned
    numerics must be set before torch loads; without them a row's logits may differ in the last bits with the batch
    size, and so may its draws."""
    from data_prep.tiny_policy import demo_numerics_env

    env = {**os.environ, **demo_numerics_env(), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", GENERATE_STREAM, str(model_dir), json.dumps(prompts)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[4])
    assert run.returncode == 0 and run.stdout.strip().endswith("same"), run.stderr[-2000:]


@pytest.mark.parametrize("stops", [["</search>", "</answer>"], ["capital of", "e c", "東京"], ["</search>", "ok "]])
def test_stop_check_by_candidate_ids_ends_where_decoding_every_token_does(qwen_tokenizer, stops):
    """The decode loop decodes a row's newest tokens only after a token that can complete a stop string
    (``stop_candidates``: its text holds a stop's last character; every token when a stop ends in whitespace). Guards
    against that shortcut missing an end that decoding after every token finds, on Qwen2.5's byte-level vocabulary
    (stops that span tokens, end inside one, or end in a multi-byte character split over tokens)."""
    tok = qwen_tokenizer
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)
    candidates = stop_candidates(tok, stops)
    check = StopCheck([tok.eos_token_id], stops, candidates, decode)
    every = StopCheck([tok.eos_token_id], stops, None, decode)
    assert (candidates is None) == (stops[-1] == "ok ")
    text = "<search> the capital of France </search>\n\n</answer>. e c 東京 é ok fine"
    pool = tok(text, add_special_tokens=False)["input_ids"] + tok("東京", add_special_tokens=False)["input_ids"]
    gen = torch.Generator().manual_seed(1)
    ended_by_stop = 0
    for _ in range(300):
        ids = [pool[i] for i in torch.randint(len(pool), (30,), generator=gen).tolist()]
        ends = [t for t in range(1, len(ids) + 1) if every.ends(ids[:t])]
        first = next((t for t in range(1, len(ids) + 1) if check.ends(ids[:t])), None)
        assert first == (ends[0] if ends else None), ids
        ended_by_stop += first is not None and ids[first - 1] != tok.eos_token_id
    assert ended_by_stop > 10  # the comparison saw stops end rows, not only eos
