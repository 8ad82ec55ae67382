"""The search loop on Qwen2.5's real vocabulary, where tags are several tokens that merge with their neighbours.

With the tiny tokenizer every tag is one token, so a stop string always ends on a token boundary and an
inserted block never shares a token with the text before it. Here ``</search>`` is ``</`` ``search`` ``>``,
and ``>`` merges with following newlines or punctuation (``>\\n\\n``, ``>.``). Each case checks the parsing,
the ids and the info_mask at the boundary, and where it matters the reward.
"""

from __future__ import annotations

import numpy as np
import pytest

from search_r1.llm_agent.formatting import INFO_CLOSE, INFO_OPEN, format_passages, information_block, observation_ids
from search_r1.llm_agent.generation import StopReason
from search_r1.reward import compute_score
from search_r1.search.client import RetrievalClient
from tests.search_r1.agent_settings import make_agent, search_config
from verl.protocol import Batch
from verl.trainer.reward import RewardManager
from verl.utils.seq import pack_trajectories
from verl.workers.rollout.base import SamplingParams

TOPK = 2
GREEDY = SamplingParams(max_tokens=1, temperature=0.0)
CFG = search_config(max_turns=2, max_start_length=64, max_prompt_length=464, max_response_length=400,
                    max_trajectory_length=400,
                    max_obs_length=300, do_search=True, topk=TOPK)


@pytest.fixture
def tokenizer(qwen_tokenizer):
    """Every test here runs on the real vocabulary only (the scripted engine takes its tokenizer from this)."""
    return qwen_tokenizer


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def run(tokenizer, make_engine, service_url, scripts: dict[str, list[str]]):
    engine, prompts = make_engine(scripts)
    result = make_agent(tokenizer, engine, RetrievalClient(service_url, TOPK), CFG).run(prompts, GREEDY)
    return engine, prompts, result.trajectories


def test_stop_string_ending_inside_a_token(tokenizer, make_engine, service_url):
    """Guards against losing or misreading a search whose ``</search>`` ends inside the last sampled token
    (``>\\n\\n``): the query must still be parsed, the whole token kept as the policy's (info_mask 1), and the
    block appended right after it."""
    engine, prompts, (traj,) = run(tokenizer, make_engine, service_url, {
        "<|im_start|>user\nq<|im_end|>\n": ["<think> look it up </think>\n<search> capital of France </search>\n\n"
                                            "ignored text", "<answer> Paris </answer>"]})
    first = engine.emitted[tuple(prompts[0])][0]
    assert tokenizer.decode(first[-1:]) == ">\n\n"  # the stop string ends inside this token
    assert tokenizer.decode(first).endswith("</search>\n\n")
    (block, truncated), = observation_ids(tokenizer, [RetrievalClient(service_url, TOPK).search(
        ["capital of France"])[0]], CFG.data.max_obs_length)
    assert not truncated
    n = len(first)
    assert traj.response_ids[:n] == first and traj.info_mask[:n] == [1] * n
    assert traj.response_ids[n:n + len(block)] == block and traj.info_mask[n:n + len(block)] == [0] * len(block)
    assert traj.num_searches == 1 and traj.stop_reason is StopReason.ANSWERED


def test_information_block_whose_first_token_would_merge_with_the_text_before(tokenizer, make_engine, service_url):
    """Guards against re-tokenising the trajectory (Search-R1 decodes and re-encodes): the sampled turn ends in
    ``>`` and the block starts with ``\\n\\n``, which re-tokenised become the single token ``>\\n\\n`` straddling
    the boundary, so no info_mask could be right. The loop keeps the sampled ids and the block's ids apart, and
    the mask flips exactly at the boundary."""
    engine, prompts, (traj,) = run(tokenizer, make_engine, service_url, {
        "<|im_start|>user\nq<|im_end|>\n": ["<search> capital of Japan </search>", "<answer> Tokyo </answer>"]})
    first = engine.emitted[tuple(prompts[0])][0]
    n = len(first)
    assert tokenizer.decode(first[-1:]) == ">" and traj.response_ids[n:n + 1] == encode(tokenizer, "\n\n")
    retokenised = encode(tokenizer, tokenizer.decode(traj.response_ids))
    assert retokenised != traj.response_ids
    assert retokenised[n - 1:n] == encode(tokenizer, ">\n\n")  # one token across the sampled/inserted boundary
    assert traj.info_mask[:n] == [1] * n and traj.info_mask[n] == 0
    inserted = [t for t, m in zip(traj.response_ids, traj.info_mask, strict=True) if m == 0]
    docs = RetrievalClient(service_url, TOPK).search(["capital of Japan"])[0]
    assert tokenizer.decode(inserted) == information_block(docs)
    assert inserted == encode(tokenizer, information_block(docs))  # the block as the tokenizer writes it anywhere


def test_untruncated_block_is_tokenised_as_one_text(tokenizer):
    """Guards against tokenising the tags and the passages separately when the block fits: a real vocabulary
    merges across those boundaries (``.</``), so the parts' ids are not how the model reads the text."""
    docs = [{"id": "x", "contents": '"Paris"\nParis is the capital of France.'}]
    (block, truncated), = observation_ids(tokenizer, [docs], 300)
    text = information_block(docs)
    parts = encode(tokenizer, INFO_OPEN) + encode(tokenizer, format_passages(docs)) + encode(tokenizer, INFO_CLOSE)
    assert not truncated and block == encode(tokenizer, text) and block != parts
    assert tokenizer.convert_ids_to_tokens(block).count(".</") == 1


def test_multi_token_answer_tag_with_spill_is_scored(tokenizer, make_engine, service_url):
    """Guards against rewarding or placing the reward wrongly when ``</answer>`` ends inside ``>.``: the answer is
    parsed, the row ends answered, the decoded response scores EM 1, and the score sits on the last sampled token
    (never on an inserted one)."""
    engine, prompts, trajs = run(tokenizer, make_engine, service_url, {
        "<|im_start|>user\na<|im_end|>\n": ["<search> highest mountain </search>", "<answer> Mount Everest </answer>."],
        "<|im_start|>user\nb<|im_end|>\n": ["<answer> Berlin </answer>\n"],
    })
    for prompt, traj in zip(prompts, trajs, strict=True):
        assert traj.stop_reason is StopReason.ANSWERED
        last = engine.emitted[tuple(prompt)][-1]
        assert tokenizer.decode(last[-1:]) in {">.", ">\n"}
    tensors = pack_trajectories([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                                [t.info_mask for t in trajs], tokenizer.pad_token_id)
    tensors["loss_mask"] = tensors["response_mask"] * tensors["info_mask"]
    batch = Batch(tensors, {"data_source": np.array(["nq", "nq"], dtype=object),
                            "ground_truth": [{"target": ["Mount Everest"]}, {"target": ["Berlin"]}],
                            "extra_info": [{}, {}]})
    token_scores, scores, texts, _ = RewardManager(tokenizer, compute_score)(batch)
    assert list(scores) == [1.0, 1.0]
    assert "<information>" in texts[0] and texts[0].endswith("</answer>.")
    for i, traj in enumerate(trajs):
        last_sampled = max(t for t, m in enumerate(traj.info_mask) if m == 1)
        assert last_sampled == len(traj.response_ids) - 1
        assert token_scores[i].nonzero().flatten().tolist() == [last_sampled]
