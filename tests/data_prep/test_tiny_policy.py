"""Tests of the tiny demo policy: scripted trajectories, their token layout and masks, their SFT rows, and a
tiny-budget warm start through main_sft against the real retrieval service whose saved model loads and generates."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_prep.demo_kb import MULTI, build_kb, load_questions, write_kb
from data_prep.tiny_model import train_tokenizer
from data_prep.tiny_policy import (
    IGNORE,
    WarmStartConfig,
    build_tiny_policy,
    copy_task_batch,
    encode_trajectory,
    observation_ids,
    prompt_ids,
    script_trajectories,
    search_unique,
    shared_prefix_length,
    trajectory_texts,
)
from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess
from search_r1.llm_agent.formatting import INFO_CLOSE, INFO_OPEN
from search_r1.search.client import RetrievalClient

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A small demo KB on disk, its BM25 index and the real retrieval service over it."""
    root = tmp_path_factory.mktemp("tiny_policy")
    entities, questions = build_kb(seed=5, n_groups=40, n_test_groups=5)
    write_kb(root / "data", entities, questions)
    build_index(root / "data" / "corpus.jsonl", root / "index", retriever="bm25", progress=False)
    with ServerProcess(root / "index", root / "data" / "corpus.jsonl", ["--threads", "1"]) as server:
        server.wait_ready()
        client = RetrievalClient(server.url, topk=3)
        yield root, client
        client.close()


@pytest.fixture(scope="module")
def scripted(demo):
    root, client = demo
    questions = load_questions(root / "data", "train")
    cfg = WarmStartConfig(trajectories_per_question=3)
    trajs = script_trajectories(questions, client.search, cfg, random.Random(0))
    tokenizer = train_tokenizer(trajectory_texts(trajs) + [q.question for q in questions], vocab_size=700)
    return trajs, tokenizer, cfg


def test_scripted_agent_is_imperfect_but_searches_correctly(scripted):
    """Guards against a scripted agent that is always right (RL would have nothing to learn) or never searches
    correctly (the warm start would not teach the mechanics): guesses, early stops and full chains all occur,
    every executed search retrieves the queried entity's own passage first, and the first think states the
    plan that the later turns follow (what the policy decides after a passage is then determined by its own
    earlier words, which the tiny model learns reliably)."""
    trajs, _, _ = scripted
    kinds = {"guess": 0, "early": 0, "full": 0}
    for t in trajs:
        searches = [s for s in t.segments if s.docs is not None]
        if not searches:
            kinds["guess"] += 1
            assert t.question.answers[0] not in t.segments[0].text  # a wrong guess
        elif len(searches) < len(t.question.chain):
            kinds["early"] += 1
            assert t.question.data_source == MULTI
        else:
            kinds["full"] += 1
            assert t.question.answers[0] in t.segments[-1].text
        if searches:  # the plan is the first word: two hops exactly when the trajectory searches twice
            two_hops = t.segments[0].text.startswith("<think> Two hops")
            assert two_hops == (len(searches) == 2), t.segments[0].text
        for seg, hop in zip(searches, t.question.chain, strict=False):
            assert seg.docs[0]["contents"].startswith(f'"{hop.query}"\n')
            assert hop.answer in seg.docs[0]["contents"]
    assert all(n > 0 for n in kinds.values()), kinds
    assert 0.35 < kinds["guess"] / len(trajs) < 0.75


def test_encoded_layout_matches_the_agent_loop(scripted):
    """Guards against SFT data in a token layout the agent loop never produces (the policy would be trained on
    one format and rolled out in another) and against training on inserted tokens: prompt = chat template,
    each inserted block = open tag + passages + close tag encoded separately, labels only on policy tokens,
    the final answer followed by eos."""
    trajs, tokenizer, cfg = scripted
    for traj in trajs[:60]:
        ids, labels, n_prompt = encode_trajectory(tokenizer, traj, cfg.max_obs_length)
        assert ids[:n_prompt] == prompt_ids(tokenizer, traj.question.question)
        assert len(ids) == len(labels)
        pos = n_prompt
        for seg in traj.segments:
            if seg.docs is not None:
                block = observation_ids(tokenizer, seg.docs, cfg.max_obs_length)
                assert len(block) <= cfg.max_obs_length
                assert block[:len(tokenizer.encode(INFO_OPEN))] == tokenizer.encode(INFO_OPEN)
                assert block[-len(tokenizer.encode(INFO_CLOSE)):] == tokenizer.encode(INFO_CLOSE)
                assert ids[pos:pos + len(block)] == block
                assert set(labels[pos:pos + len(block)]) == {IGNORE}
                pos += len(block)
            else:
                part = tokenizer.encode(seg.text) + ([tokenizer.eos_token_id] if seg.eos else [])
                assert ids[pos:pos + len(part)] == part and labels[pos:pos + len(part)] == part
                pos += len(part)
        assert pos == len(ids)
        assert set(labels[:n_prompt]) == {IGNORE}
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids[n_prompt:]).startswith("<think>")


def test_copy_task_rows_repeat_a_sequence_with_loss_on_the_predictable_part():
    """Guards against the copy task putting loss on unpredictable tokens (the first half, or the first token
    of the repeat), which would teach unigram noise instead of copying, or on padding."""
    batch = copy_task_batch(list(range(10, 60)), rows=8, max_length=12, rng=random.Random(0), pad_id=0)
    for ids, labels, mask in zip(batch["input_ids"].tolist(), batch["labels"].tolist(),
                                 batch["attention_mask"].tolist(), strict=True):
        n = sum(mask) // 2
        assert 4 <= n <= 12 and ids[:n] == ids[n:2 * n]
        assert labels[:n + 1] == [IGNORE] * (n + 1) and labels[n + 1:2 * n] == ids[n + 1:2 * n]
        assert set(labels[2 * n:]) <= {IGNORE}


def test_search_unique_deduplicates_and_chunks():
    """Guards against requests over the service's query limit and against results assigned to the wrong
    query when duplicates are collapsed."""
    calls = []

    def search(queries):
        calls.append(list(queries))
        return [[{"id": q, "contents": q}] for q in queries]

    queries = [f"q{i % 7}" for i in range(30)]
    results = search_unique(search, queries, max_queries=3)
    assert [r[0]["id"] for r in results] == queries
    assert [len(c) for c in calls] == [3, 3, 1]


def test_warm_start_rows_hold_the_loops_tokens_and_masks(scripted, tmp_path):
    """Guards against a warm start training on other tokens than the agent loop's (a passage block tokenised or cut
    differently, a lost turn, a mask on the prompt or the passages): every trajectory's SFT row, read by the SFT
    dataset, has ``encode_trajectory``'s ids (the loop's layout, ``test_encoded_layout_matches_the_agent_loop``;
    without the EOS it appends after the answer) and loss positions; nothing else is in the rows."""
    from data_prep import warm_start_sft
    from verl.utils.sft_dataset import TrajectoryDataset

    trajs, tokenizer, cfg = scripted
    path = warm_start_sft.write_rows(trajs, tokenizer, cfg.max_obs_length, tmp_path / "rows.parquet")
    data = TrajectoryDataset(str(path), tokenizer, 100000)
    assert len(data) == len(trajs)
    cut = 0
    for k, traj in enumerate(trajs):
        ids, labels, n_prompt = encode_trajectory(tokenizer, traj, cfg.max_obs_length)
        assert ids[-1] == tokenizer.eos_token_id
        assert data.prompt_ids[k] == ids[:n_prompt] and data.response_ids[k] == ids[n_prompt:-1], k
        assert data.info_masks[k] == [int(label != IGNORE) for label in labels[n_prompt:-1]], k
        cut += sum(len(observation_ids(tokenizer, seg.docs, 10**6)) > cfg.max_obs_length
                   for seg in traj.segments if seg.docs is not None)
    assert cut > 0  # blocks the loop cuts are among them


def test_copy_rows_sit_after_the_instruction_and_train_only_the_repeat(scripted, tmp_path):
    """Guards against copy rows that teach the policy to write something on its own (a trained first sequence, or a
    copy after the chat template's assistant header, the failures of copy rows as SFT rows) or that are not where
    the own loop put them: each text row's prompt is exactly the instruction every trajectory starts with, then a
    sequence of 8-24 tokens of the given words; the trained response has exactly that sequence's ids."""
    from data_prep import warm_start_sft
    from verl.utils.sft_dataset import TextDataset

    trajs, tokenizer, cfg = scripted
    examples = [encode_trajectory(tokenizer, t, cfg.max_obs_length)[:2] for t in trajs[:20]]
    prefix = examples[0][0][:shared_prefix_length(examples)]
    assert tokenizer.decode(prefix).rstrip(": ").endswith("Question")  # the instruction, up to the question
    words = ["Vuzaholm", "Arlen", "Tosk", "guild", "north"]
    rows = warm_start_sft.copy_text_rows(tokenizer, prefix, words, " ", 6, 24, random.Random(1))
    data = TextDataset(str(warm_start_sft.write_text_rows(rows, tmp_path / "copy.parquet")), tokenizer, 100000)
    assert len(data) == 6
    longest_word = max(len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) for w in words)
    for k in range(6):
        assert data.prompt_ids[k][:len(prefix)] == prefix, k
        shown, trained = data.prompt_ids[k][len(prefix):], data.response_ids[k]
        assert shown == trained and data.info_masks[k] == [1] * len(trained)
        assert 8 <= len(trained) < 24 + longest_word
        assert set(tokenizer.decode(trained).split()) <= set(words)


def test_warm_start_through_main_sft_saves_a_policy_that_loads_and_generates(demo, tmp_path):
    """Guards against a warm start that cannot run end to end or saves something transformers cannot load (missing
    tokenizer files, chat template, eos/pad ids): a few copy and trajectory steps through main_sft, then load and
    generate; the SFT run (rows, checkpoints, metrics) is kept beside the model."""
    root, client = demo
    cfg = WarmStartConfig(steps=3, copy_steps=2, tokens_per_batch=600, trajectories_per_question=1, vocab_size=600)
    figures = build_tiny_policy(root / "data", tmp_path / "policy", client.search, cfg)
    assert figures["trajectories"] == 35 * 2 and figures["final_loss"] > 0
    assert figures["max_response_tokens"] <= 320 and figures["max_prompt_tokens"] <= 256
    run = tmp_path / "policy" / "warm_start" / "sft"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and (run / "hf_model").is_dir()
    assert all(r["train/mix_loss"] > 0 for r in records)  # the copy rows are mixed into every step
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "policy")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert model.config.hidden_size // model.config.num_attention_heads == 64
    assert tokenizer.convert_tokens_to_ids("</search>") != tokenizer.unk_token_id
    ids = prompt_ids(tokenizer, "Who founded the Lorem Guild?")
    out = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)
    assert out.shape[1] == len(ids) + 5 or out[0, -1].item() == tokenizer.eos_token_id
    assert (tmp_path / "policy" / "warm_start.json").exists()
