"""The search loop driven by a scripted policy against the real retrieval service on loopback."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from search_r1.config import SearchConfig
from search_r1.llm_agent.formatting import (
    INFO_CLOSE,
    INFO_OPEN,
    INVALID_ACTION_FEEDBACK,
    format_passages,
    information_block,
)
from search_r1.llm_agent.generation import ActionKind, StopReason, search_agent
from search_r1.llm_agent.tags import TagFormat, parse_action
from search_r1.search.client import RetrievalClient, RetrievalError
from tests.search_r1.agent_settings import make_agent, search_config
from verl.config import load_config
from verl.protocol import Batch
from verl.utils.seq import pack_trajectories
from verl.workers.rollout.base import SamplingParams

TOPK = 2
GREEDY = SamplingParams(max_tokens=1, temperature=0.0)


class CountingClient(RetrievalClient):
    """The real client, recording the queries of every ``search`` call (one call = one POST)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests: list[list[str]] = []

    def search(self, queries: list[str]) -> list[list[dict]]:
        self.requests.append(list(queries))
        return super().search(queries)


def agent_cfg(**overrides) -> SearchConfig:
    cfg = dict(max_turns=3, max_start_length=64, max_prompt_length=464, max_response_length=400,
               max_trajectory_length=400, max_obs_length=300, do_search=True, topk=TOPK)
    return search_config(**{**cfg, **overrides})


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


MIXED = {
    "<|im_start|>user\nrow zero<|im_end|>\n": [
        "<think> I should search </think><search> capital of France </search>",
        "<think> again </think><search> highest mountain </search>",
        "<think> done </think><answer> Paris </answer>",
    ],
    "<|im_start|>user\nrow one<|im_end|>\n": ["<think> I know it </think><answer> Berlin </answer>"],
    "<|im_start|>user\nrow two<|im_end|>\n": ["<search> capital of Japan </search>", "<answer> Tokyo </answer>"],
    "<|im_start|>user\nrow three<|im_end|>\n": ["<think> hm </think> no opening tag </search>",
                                                "<answer> Nile </answer>"],
}


# rows that would search past max_turns=2: one keeps searching, one answers in its final turn, one ends invalid
SEARCH_PAST_MAX_TURNS = {
    "<|im_start|>user\nkeeps searching<|im_end|>\n": [
        "<search> capital of France </search>", "<search> capital of Germany </search>",
        "<search> capital of Japan </search>"],
    "<|im_start|>user\nanswers last<|im_end|>\n": [
        "<search> Nile river </search>", "<search> Everest </search>", "<answer> Nile </answer>"],
    "<|im_start|>user\ninvalid last<|im_end|>\n": [
        "<search> Curie </search>", "<search> Curie Nobel </search>", "no action at all </answer>"],
}


@pytest.fixture
def mixed_run(tokenizer, make_engine, service_url):
    """Rows that search twice, answer at once, search once, and act invalidly then answer."""
    engine, prompts = make_engine(MIXED)
    client = CountingClient(service_url, TOPK)
    result = make_agent(tokenizer, engine, client, agent_cfg()).run(prompts, GREEDY)
    return engine, client, prompts, result


def test_searching_rows_share_one_request_per_turn(mixed_run):
    """Guards against one retrieval request per row (or per query) instead of one batched request per turn."""
    _, client, _, result = mixed_run
    assert client.requests == [["capital of France", "capital of Japan"], ["highest mountain"]]
    assert [t.num_searches for t in result.trajectories] == [2, 0, 1, 0]


def test_finished_rows_stop_generating(mixed_run):
    """Guards against answered rows being sent to the engine again (wasted compute, extra tokens)."""
    engine, _, prompts, result = mixed_run
    assert [len(contexts) for contexts, _ in engine.calls] == [4, 3, 1]
    answered_row_one = tuple(prompts[1])
    for contexts, _ in engine.calls[1:]:
        assert all(tuple(c[:len(answered_row_one)]) != answered_row_one for c in contexts)
    assert [t.stop_reason for t in result.trajectories] == [StopReason.ANSWERED] * 4
    assert [t.num_turns for t in result.trajectories] == [3, 1, 2, 2]
    assert [t.num_invalid for t in result.trajectories] == [0, 0, 0, 1]


def test_response_is_sampled_ids_plus_inserted_ids(mixed_run, tokenizer, service_url):
    """Guards against decode/re-encode of sampled text and against a wrong info_mask: the response must be
    exactly the ids the engine emitted plus the tokenised inserted blocks, with info_mask 1 only on the former."""
    engine, _, prompts, result = mixed_run
    fresh = RetrievalClient(service_url, TOPK)
    for prompt, traj in zip(prompts, result.trajectories, strict=True):
        turns = engine.emitted[tuple(prompt)]
        expected_ids, expected_mask = [], []
        for turn_ids in turns:
            expected_ids += turn_ids
            expected_mask += [1] * len(turn_ids)
            text = tokenizer.decode(turn_ids)
            if text.endswith("</search>") and "<search>" in text:
                query = text[text.rindex("<search>") + len("<search>"):-len("</search>")].strip()
                inserted = encode(tokenizer, information_block(fresh.search([query])[0]))
            elif not text.endswith("</answer>"):
                inserted = encode(tokenizer, INVALID_ACTION_FEEDBACK)
            else:
                inserted = []
            expected_ids += inserted
            expected_mask += [0] * len(inserted)
        assert traj.prompt_ids == prompt
        assert traj.response_ids == expected_ids
        assert traj.info_mask == expected_mask


def test_engine_continues_the_exact_trajectory(mixed_run):
    """Guards against the engine being fed a re-tokenised or cut context: every context it received is
    the row's prompt followed by a prefix of the row's final response."""
    engine, _, prompts, result = mixed_run
    by_prompt = {tuple(p): t for p, t in zip(prompts, result.trajectories, strict=True)}
    for contexts, params in engine.calls:
        assert params.stop == ["</search>", "</answer>"]
        for context in contexts:
            traj = by_prompt[engine.row_of(context)]
            full = traj.prompt_ids + traj.response_ids
            assert context == full[:len(context)]


def test_metrics_match_a_plain_count(mixed_run):
    """Guards against metrics that disagree with the trajectories (e.g. averaging over active rows only)."""
    _, _, _, result = mixed_run
    trajs = result.trajectories
    turns = invalid = searches = answered = tokens = inserted = 0
    for t in trajs:
        turns += t.num_turns
        invalid += t.num_invalid
        searches += t.num_searches
        answered += t.stop_reason is StopReason.ANSWERED
        tokens += len(t.response_ids)
        for m in t.info_mask:
            inserted += m == 0
    m = result.metrics()
    assert m["agent/mean_turns"] == pytest.approx(turns / 4) and m["agent/turns"] == turns
    assert m["agent/searches_per_traj"] == pytest.approx(searches / 4)
    assert m["agent/valid_action_ratio"] == pytest.approx(1 - invalid / turns)
    assert m["agent/finish_ratio"] == pytest.approx(answered / 4)
    assert m["agent/inserted_token_frac"] == pytest.approx(inserted / tokens)
    assert m["agent/mean_response_len"] == pytest.approx(tokens / 4)
    assert m["agent/stop/answered"] == 4 and m["agent/stop/max_turns"] == 0
    assert m["agent/truncated_obs"] == 0


def test_max_turns_forces_a_final_turn_without_search(tokenizer, make_engine, service_url):
    """Guards against executing searches after max_turns, or ending without the final answer turn."""
    engine, prompts = make_engine(SEARCH_PAST_MAX_TURNS)
    client = CountingClient(service_url, TOPK)
    result = make_agent(tokenizer, engine, client, agent_cfg(max_turns=2)).run(prompts, GREEDY)
    assert client.requests == [["capital of France", "Nile river", "Curie"],
                               ["capital of Germany", "Everest", "Curie Nobel"]]
    assert [t.stop_reason for t in result.trajectories] == [StopReason.MAX_TURNS, StopReason.ANSWERED,
                                                           StopReason.MAX_TURNS]
    assert [t.num_turns for t in result.trajectories] == [3, 3, 3]
    assert [t.num_searches for t in result.trajectories] == [2, 2, 2]
    assert result.trajectories[2].num_invalid == 1
    for prompt, traj in zip(prompts, result.trajectories, strict=True):
        last = engine.emitted[tuple(prompt)][-1]
        assert traj.response_ids[-len(last):] == last  # nothing inserted after the final turn
        assert traj.info_mask[-len(last):] == [1] * len(last)


def test_long_observation_is_truncated_and_closed(tokenizer, make_engine, service_url):
    """Guards against over-long observations blowing the budget, losing their closing tag, or going uncounted."""
    engine, prompts = make_engine({
        "<|im_start|>user\nlong<|im_end|>\n": ["<search> Marie Curie Nobel radium </search>", "<answer> x </answer>"],
    })
    max_obs = 24
    client = CountingClient(service_url, TOPK)
    result = make_agent(tokenizer, engine, client, agent_cfg(max_obs_length=max_obs)).run(prompts, GREEDY)
    traj = result.trajectories[0]
    sampled = engine.emitted[tuple(prompts[0])][0]
    block = traj.response_ids[len(sampled):len(sampled) + max_obs]
    docs = client.search(["Marie Curie Nobel radium"])[0]
    passages = encode(tokenizer, format_passages(docs))
    open_ids, close_ids = encode(tokenizer, INFO_OPEN), encode(tokenizer, INFO_CLOSE)
    assert len(encode(tokenizer, information_block(docs))) > max_obs
    assert block == open_ids + passages[:max_obs - len(open_ids) - len(close_ids)] + close_ids
    assert traj.info_mask[len(sampled):len(sampled) + max_obs] == [0] * max_obs
    assert traj.truncated_obs == 1 and result.metrics()["agent/truncated_obs"] == 1
    assert traj.stop_reason is StopReason.ANSWERED


def test_most_searches_cut_warns_once_naming_the_key(tokenizer, make_engine, service_url, caplog):
    """Guards against Search-R1-length passages being cut on every search without a word (a demo-sized
    max_obs_length on real passages): more than half cut -> one warning naming data.max_obs_length, once per run;
    half or fewer -> none."""
    script = {"<|im_start|>user\nlong<|im_end|>\n": ["<search> Marie Curie Nobel radium </search>",
                                                     "<answer> x </answer>"]}
    engine, prompts = make_engine(script)
    agent = make_agent(tokenizer, engine, CountingClient(service_url, TOPK), agent_cfg(max_obs_length=24))
    with caplog.at_level(logging.WARNING, logger="search_r1.llm_agent.tags"):
        agent.run(prompts, GREEDY)
        agent.engine, _ = make_engine(script)  # a second step of the same run
        agent.run(prompts, GREEDY)
    warnings = [r.getMessage() for r in caplog.records if "max_obs_length" in r.getMessage()]
    assert len(warnings) == 1 and "1 of 1 searches" in warnings[0] and "data.max_obs_length=24" in warnings[0]
    caplog.clear()
    engine, prompts = make_engine(script)
    roomy = make_agent(tokenizer, engine, CountingClient(service_url, TOPK), agent_cfg(max_obs_length=2000))
    with caplog.at_level(logging.WARNING, logger="search_r1.llm_agent.tags"):
        result = roomy.run(prompts, GREEDY)
    assert result.metrics()["agent/truncated_obs"] == 0 and "max_obs_length" not in caplog.text


def test_observation_that_does_not_fit_ends_the_row(tokenizer, make_engine, service_url):
    """Guards against responses longer than max_response_length and against requests for rows with no room left."""
    search_fits = "<search> capital of France </search>"
    search_full = "<think> a b c d </think><search> capital of Japan </search>"
    engine, prompts = make_engine({"<|im_start|>user\nA<|im_end|>\n": [search_fits],
                                   "<|im_start|>user\nB<|im_end|>\n": [search_full]})
    budget = len(encode(tokenizer, search_full)) + 3  # less than an empty <information> block
    client = CountingClient(service_url, TOPK)
    cfg = agent_cfg(max_response_length=budget, max_trajectory_length=budget, max_obs_length=60)
    result = make_agent(tokenizer, engine, client, cfg).run(prompts, GREEDY)
    assert client.requests == [["capital of France"]]
    for prompt, traj in zip(prompts, result.trajectories, strict=True):
        assert traj.stop_reason is StopReason.MAX_LENGTH
        assert traj.response_ids == engine.emitted[tuple(prompt)][0]  # no block appended
        assert traj.num_searches == 0


def test_each_row_is_cut_to_its_own_budget(tokenizer, make_engine):
    """Guards against one row's remaining budget (the turn's max_tokens) letting another row overrun its own."""
    engine, prompts = make_engine({
        "<|im_start|>user\nlong<|im_end|>\n": ["<search> x </search>", "<think>" + " word" * 60],
        "<|im_start|>user\nshort<|im_end|>\n": ["<search>x</search>", "<answer> y </answer>"],
    })
    max_len = 40
    cfg = agent_cfg(max_response_length=max_len, max_trajectory_length=max_len, do_search=False)
    result = make_agent(tokenizer, engine, None, cfg).run(prompts, GREEDY)
    for contexts, params in engine.calls:
        budgets = [max_len - (len(c) - len(engine.row_of(c))) for c in contexts]
        assert params.max_tokens == max(budgets)
    long_row, short_row = result.trajectories
    assert long_row.stop_reason is StopReason.MAX_LENGTH and len(long_row.response_ids) == max_len
    first, second = engine.emitted[tuple(prompts[0])]
    kept = long_row.response_ids[len(first) + len(encode(tokenizer, information_block([]))):]
    assert len(second) > len(kept)  # the engine sampled past this row's budget: the loop cut it
    assert kept == second[:len(kept)]
    assert short_row.stop_reason is StopReason.ANSWERED


def test_generation_function_marks_exactly_the_rows_cut_by_the_budget(tokenizer, make_engine):
    """Guards against the trainer's overlong handling (algorithm.overlong) missing a cut row or catching a row that
    stopped on its own: ``truncated`` is True exactly for the rows that ended with MAX_LENGTH."""
    engine, prompts = make_engine({
        "<|im_start|>user\nlong<|im_end|>\n": ["<search> x </search>", "<think>" + " word" * 60],
        "<|im_start|>user\nshort<|im_end|>\n": ["<search>x</search>", "<answer> y </answer>"],
    })
    agent = make_agent(tokenizer, engine, None, agent_cfg(max_response_length=40, max_trajectory_length=40,
                                                                          do_search=False))
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [np.array(p) for p in prompts]
    out = agent(Batch({}, {"raw_prompt_ids": raw}), GREEDY)
    assert list(out["stop_reason"]) == ["max_length", "answered"]
    assert list(out["truncated"]) == [True, False]


def test_no_search_gives_empty_information_blocks(tokenizer, make_engine):
    """Guards against do_search=false still calling the service (or needing one)."""
    engine, prompts = make_engine({"<|im_start|>user\nq<|im_end|>\n": ["<search> anything </search>",
                                                                       "<answer> a </answer>"]})
    result = make_agent(tokenizer, engine, None, agent_cfg(do_search=False)).run(prompts, GREEDY)
    traj = result.trajectories[0]
    sampled = engine.emitted[tuple(prompts[0])][0]
    empty = encode(tokenizer, information_block([]))
    assert traj.response_ids[len(sampled):len(sampled) + len(empty)] == empty
    assert traj.num_searches == 1 and traj.stop_reason is StopReason.ANSWERED
    with pytest.raises(ValueError, match="do_search"):
        make_agent(tokenizer, engine, None, agent_cfg(do_search=True))


def test_eos_without_answer_ends_the_row(tokenizer, make_engine):
    """Guards against appending text after the policy's EOS or counting an EOS as a valid action."""
    engine, prompts = make_engine({"<|im_start|>user\nq<|im_end|>\n": ["<think> no idea </think><|im_end|>"]})
    result = make_agent(tokenizer, engine, None, agent_cfg(do_search=False)).run(prompts, GREEDY)
    traj = result.trajectories[0]
    assert traj.stop_reason is StopReason.EOS_WITHOUT_ANSWER
    assert traj.response_ids[-1] == tokenizer.eos_token_id and traj.info_mask == [1] * len(traj.response_ids)
    assert traj.num_invalid == 1 and result.metrics()["agent/valid_action_ratio"] == 0.0


def test_prompt_limits(tokenizer, make_engine):
    """Guards against silently training on over-long prompts and against n > 1 (rows would misalign)."""
    text = "<|im_start|>user\n" + "one two three four five six seven eight nine ten " * 3 + "<|im_end|>\n"
    engine, prompts = make_engine({text: ["<answer> a </answer>"]})
    n_tokens = len(prompts[0])
    engine.expect_prompts_cut(5)
    agent = make_agent(tokenizer, engine, None, agent_cfg(do_search=False, max_start_length=n_tokens - 5,
                                                                    max_prompt_length=n_tokens))
    result = agent.run(prompts, GREEDY)
    assert result.trajectories[0].prompt_ids == prompts[0][5:]
    assert result.metrics()["agent/truncated_prompts"] == 1
    with pytest.raises(ValueError, match="max_prompt_length"):
        make_agent(tokenizer, engine, None, agent_cfg(do_search=False, max_prompt_length=n_tokens - 1,
                                                                max_start_length=n_tokens - 1)).run(prompts, GREEDY)
    with pytest.raises(ValueError, match="n=2"):
        agent.run(prompts, SamplingParams(max_tokens=1, n=2))


def test_generation_function_returns_packed_batch(tokenizer, make_engine, service_url):
    """Guards against the trainer's generation function dropping input columns or misaligning rows."""
    engine, prompts = make_engine(MIXED)
    client = RetrievalClient(service_url, TOPK)
    agent = make_agent(tokenizer, engine, client, agent_cfg())
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [np.array(p) for p in prompts]
    batch = Batch({}, {"raw_prompt_ids": raw, "uid": np.array(["a", "b", "c", "d"], dtype=object)}, {"step": 3})
    out = agent(batch, GREEDY)
    engine2, _ = make_engine(MIXED)
    trajs = make_agent(tokenizer, engine2, client, agent_cfg()).run(prompts, GREEDY).trajectories
    packed = pack_trajectories([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                               [t.info_mask for t in trajs], tokenizer.pad_token_id)
    for key, tensor in packed.items():
        assert torch.equal(out[key], tensor), key
    assert list(out["uid"]) == ["a", "b", "c", "d"]
    assert list(out["stop_reason"]) == ["answered"] * 4 and list(out["truncated"]) == [False] * 4
    assert list(out["num_searches"]) == [2, 0, 1, 0] and list(out["num_turns"]) == [3, 1, 2, 2]
    assert out.meta["step"] == 3 and out.meta["gen_metrics"]["agent/searches_per_traj"] == pytest.approx(0.75)


def test_service_killed_mid_rollout_fails_naming_the_url(tokenizer, make_engine, own_service):
    """Guards against a rollout that hangs or fails obscurely when the retrieval service dies."""
    engine, prompts = make_engine({"<|im_start|>user\nq<|im_end|>\n": [
        "<search> capital of France </search>", "<search> capital of Japan </search>", "<answer> Tokyo </answer>"]})
    engine.before_call = lambda call: own_service.stop() if call == 1 else None
    client = CountingClient(own_service.url, TOPK, timeout=2.0, outage_timeout_s=0.3, backoff=0.05)
    agent = make_agent(tokenizer, engine, client, agent_cfg())
    with pytest.raises(RetrievalError, match=own_service.url.replace(".", r"\.")):
        agent.run(prompts, GREEDY)
    assert client.requests == [["capital of France"], ["capital of Japan"]]


@pytest.mark.parametrize("text, finish, stop_str, cut, expected", [
    ("<think> t </think><search> q1 </search>", "stop", "</search>", False, (ActionKind.ACT, "q1")),
    ("<search> a </search> b <search> q2 </search>", "stop", "</search>", False, (ActionKind.ACT, "q2")),
    ("<search> q3 </search>.\n", "stop", "</search>", False, (ActionKind.ACT, "q3")),  # last token spills over
    ("<search>   </search>", "stop", "</search>", False, (ActionKind.INVALID, "")),
    ("no opening </search>", "stop", "</search>", False, (ActionKind.INVALID, "")),
    ("<answer> Paris </answer>\n", "stop", None, False, (ActionKind.ANSWER, "Paris")),
    ("<answer></answer>", "stop", "</answer>", False, (ActionKind.ANSWER, "")),
    ("<search> q </search> <answer> A </answer>", "stop", "</answer>", False, (ActionKind.ANSWER, "A")),
    ("no opening </answer>", "stop", "</answer>", False, (ActionKind.INVALID, "")),
    ("<think> rambling", "length", None, False, (ActionKind.LENGTH, "")),
    ("<think> rambling <sea", "stop", "</search>", True, (ActionKind.LENGTH, "")),
    ("<think> done </think>", "stop", None, False, (ActionKind.EOS, "")),
    ("<answer> x </answer>", "length", None, False, (ActionKind.ANSWER, "x")),
])
def test_parse_action(text, finish, stop_str, cut, expected):
    """Guards against misreading a turn: empty queries, stray closing tags, several tags, a last token that
    spills past the tag, EOS vs length."""
    assert parse_action(text, finish, stop_str, cut) == expected


def test_the_search_agent_reads_the_typed_config(tokenizer, make_engine):
    """Guards against reading the wrong config key into the loop (e.g. max_prompt vs max_start length): the loop
    holds the config's own sections (no copy of their fields to fall behind), and the search's keys reach the
    format and its environment."""
    cfg = load_config(["max_turns=5", "do_search=false", "retriever.topk=7", "data.max_start_length=100",
                       "data.max_prompt_length=120", "data.max_response_length=300", "data.max_obs_length=50",
                       "retriever.coalesce_ms=7", "actor_rollout_ref.rollout.mode=async"])
    engine, _ = make_engine({"<|im_start|>user\nq<|im_end|>\n": ["<answer> a </answer>"]})
    agent = search_agent(cfg, tokenizer, engine, None)
    assert agent.data is cfg.data and agent.rollout is cfg.actor_rollout_ref.rollout and agent.max_turns == 5
    assert isinstance(agent.format, TagFormat) and agent.format.max_obs_length == 50
    env = agent.format.env
    assert (env.client, env.do_search, env.coalesce_ms, env.service().coalesce_s) == (None, False, 7.0, 0.007)
    cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns = 3  # replaces max_turns + 1
    assert search_agent(cfg, tokenizer, engine, None).max_turns == 2


def test_turn_prefix_inserts_forced_ids_before_the_turn(tokenizer, make_engine, service_url):
    """Guards against the evaluation's forced decisions (``turn_prefix``) being trained on, reaching the engine
    after the turn instead of before it, breaking the action parse, escaping the length budget, or being asked
    for finished rows."""
    engine, prompts = make_engine({
        "<|im_start|>user\nforced<|im_end|>\n": [" search for it. </think><search> capital of France </search>",
                                                  "<answer> Paris </answer>"],
        "<|im_start|>user\nfree<|im_end|>\n": ["<answer> Berlin </answer>"],
    })
    forced = encode(tokenizer, "<think> Let me")
    asked: list[tuple[int, int]] = []

    def prefix(row: int, turn: int, traj) -> list[int]:
        asked.append((row, turn))
        return forced if row == 0 and turn == 0 else []

    agent = make_agent(tokenizer, engine, RetrievalClient(service_url, TOPK), agent_cfg())
    trajs = agent.run(prompts, GREEDY, turn_prefix=prefix).trajectories
    first_call_contexts = engine.calls[0][0]
    assert first_call_contexts[0] == prompts[0] + forced and first_call_contexts[1] == prompts[1]
    row = trajs[0]
    assert row.response_ids[:len(forced)] == forced and row.info_mask[:len(forced)] == [0] * len(forced)
    sampled = engine.emitted[tuple(prompts[0])][0]
    assert row.response_ids[len(forced):len(forced) + len(sampled)] == sampled
    assert row.info_mask[len(forced):len(forced) + len(sampled)] == [1] * len(sampled)
    assert row.stop_reason is StopReason.ANSWERED and row.num_searches == 1 and row.num_invalid == 0
    assert sorted(asked) == [(0, 0), (0, 1), (1, 0)]  # row 1 answered in turn 0: never asked again
    budget = len(forced) + 1  # the forced ids leave one token: the row ends at once when its turn is cut
    engine, prompts = make_engine({"<|im_start|>user\nforced<|im_end|>\n": ["<answer> Paris </answer>"]})
    cfg = agent_cfg(max_response_length=budget, max_trajectory_length=budget, do_search=False)
    agent = make_agent(tokenizer, engine, None, cfg)
    (row,) = agent.run(prompts, GREEDY, turn_prefix=lambda i, t, traj: forced).trajectories
    assert len(row.response_ids) == budget and row.stop_reason is StopReason.MAX_LENGTH
