"""The search loop in ``rollout.mode: async`` against the real retrieval service on loopback, with scripted engines.

Guards against: async mode changing what a row generates or receives (ids, masks, counters, stop reasons) compared
with the lockstep schedule; a row still waiting for other rows (a turn barrier) when it has its own engine; searches
that arrive together not sharing one request; an outage in async mode hanging or raising something other than the
lockstep loop's error.
"""

from __future__ import annotations

import threading
import time

import pytest

from search_r1.llm_agent.generation import StopReason
from search_r1.search.client import RetrievalError
from tests.search_r1.agent_settings import make_agent
from tests.search_r1.llm_agent.conftest import ScriptedEngine
from tests.search_r1.llm_agent.test_agent_loop import (
    GREEDY,
    MIXED,
    SEARCH_PAST_MAX_TURNS,
    TOPK,
    CountingClient,
    agent_cfg,
    encode,
)
from verl.workers.rollout.base import SamplingParams

SCENARIOS = {
    "mixed": (MIXED, {}),
    "max_turns": (SEARCH_PAST_MAX_TURNS, {"max_turns": 2}),
    "budgets": ({
        "<|im_start|>user\nlong<|im_end|>\n": ["<search> Marie Curie Nobel radium </search>", "<think>" + " w" * 60],
        "<|im_start|>user\nshort<|im_end|>\n": ["<search>x</search>", "<answer> y </answer>"],
        "<|im_start|>user\neos<|im_end|>\n": ["<think> no idea </think><|im_end|>"],
    }, {"max_response_length": 60, "max_trajectory_length": 60, "max_obs_length": 24}),
}


def _fields(traj) -> tuple:
    return (traj.prompt_ids, traj.response_ids, traj.info_mask, traj.stop_reason, traj.num_turns, traj.num_searches,
            traj.num_invalid, traj.truncated_obs)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_async_gives_the_lockstep_trajectories(scenario, tokenizer, make_engine, service_url):
    """A scripted policy writes the same text whatever the schedule, so every row must come out identical."""
    scripts, overrides = SCENARIOS[scenario]
    results = {}
    for mode in ("sync", "async"):
        engine, prompts = make_engine(scripts)
        client = CountingClient(service_url, TOPK)
        agent = make_agent(tokenizer, engine, client, agent_cfg(mode=mode, **overrides))
        results[mode] = (agent.run(prompts, GREEDY), client)
    for sync_row, async_row in zip(results["sync"][0].trajectories, results["async"][0].trajectories, strict=True):
        assert _fields(async_row) == _fields(sync_row)
    sync_queries = sorted(q for request in results["sync"][1].requests for q in request)
    assert sorted(q for request in results["async"][1].requests for q in request) == sync_queries


class TimedEngine(ScriptedEngine):
    """A scripted engine whose every call takes ``seconds`` and records when each row's turns ended."""

    def __init__(self, tokenizer, scripts, seconds: float, log: list):
        super().__init__(tokenizer, scripts)
        self.seconds = seconds
        self.log = log
        self.lock = threading.Lock()

    def generate(self, prompts, params):
        time.sleep(self.seconds)
        with self.lock:
            outputs = super().generate(prompts, params)
            self.log.extend((time.perf_counter(), self.row_of(p)) for p in prompts)
        return outputs


class TwoEngines:
    """An ``EnginePool`` of two engines (what ``GroupRollout`` is over two ranks)."""

    num_engines = 2

    def __init__(self, engines):
        self.engines = engines

    def generate_on(self, engine, prompts, params):
        return self.engines[engine].generate(prompts, params)

    def generate(self, prompts, params):  # the lockstep schedule's call: not used in async mode
        raise AssertionError("async mode must call generate_on")


def test_no_turn_barrier_a_row_on_a_free_engine_does_not_wait(tokenizer, service_url):
    """Row "quick" (search, then answer) on a fast engine must finish both turns while row "slow" (one long turn)
    still runs on the other engine; the lockstep schedule would hold its second turn until "slow" ended."""
    texts = {"<|im_start|>user\nslow<|im_end|>\n": ["<answer> Nile </answer>"],
             "<|im_start|>user\nquick<|im_end|>\n": ["<search> capital of France </search>",
                                                    "<answer> Paris </answer>"]}
    prompts = [encode(tokenizer, p) for p in texts]
    scripts = {tuple(p): turns for p, turns in zip(prompts, texts.values(), strict=True)}
    log: list = []
    pool = TwoEngines([TimedEngine(tokenizer, dict(scripts), 1.5, log),
                       TimedEngine(tokenizer, dict(scripts), 0.05, log)])
    agent = make_agent(tokenizer, pool, CountingClient(service_url, TOPK), agent_cfg(mode="async"))
    result = agent.run(prompts, GREEDY)
    slow, quick = result.trajectories
    assert slow.stop_reason is StopReason.ANSWERED and quick.stop_reason is StopReason.ANSWERED
    assert quick.num_searches == 1 and quick.num_turns == 2
    ends = {}
    for when, row in log:
        ends.setdefault(row, []).append(when)
    slow_end, = ends[tuple(prompts[0])]
    quick_first, quick_second = ends[tuple(prompts[1])]
    assert quick_second < slow_end  # the quick row's second turn ran while the slow row's first turn was running
    assert result.schedule["perf/engine_calls"] == 3


def test_searches_that_arrive_together_share_one_request(tokenizer, make_engine, service_url):
    """Eight rows search in the same round: one POST with eight queries; at most coalesce_max queries per POST."""
    scripts = {f"<|im_start|>user\nrow {i}<|im_end|>\n": [f"<search> capital number {i} </search>",
                                                           "<answer> x </answer>"] for i in range(8)}
    for coalesce_max, expected_sizes in ((512, [8]), (3, [3, 3, 2])):
        engine, prompts = make_engine(scripts)
        client = CountingClient(service_url, TOPK)
        cfg = agent_cfg(mode="async", coalesce_ms=50, coalesce_max=coalesce_max)
        result = make_agent(tokenizer, engine, client, cfg).run(prompts, GREEDY)
        assert sorted(len(r) for r in client.requests) == sorted(expected_sizes)
        assert sorted(q for r in client.requests for q in r) == sorted(f"capital number {i}" for i in range(8))
        assert all(t.num_searches == 1 and t.stop_reason is StopReason.ANSWERED for t in result.trajectories)
        assert result.schedule["perf/retrieval_calls"] == len(expected_sizes)


def test_outage_in_async_mode_raises_the_lockstep_error(tokenizer, make_engine, own_service):
    """The service dies after the first search: the run must end with the same RetrievalError naming the URL (the
    trainer's outage path), not hang and not leave an engine call running."""
    engine, prompts = make_engine({"<|im_start|>user\nq<|im_end|>\n": [
        "<search> capital of France </search>", "<search> capital of Japan </search>", "<answer> Tokyo </answer>"],
        "<|im_start|>user\nother<|im_end|>\n": ["<think> long </think><search> Nile </search>", "<answer> a </answer>",
                                                 "<answer> b </answer>"]})
    engine.before_call = lambda call: own_service.stop() if call == 1 else None
    client = CountingClient(own_service.url, TOPK, timeout=2.0, outage_timeout_s=0.3, backoff=0.05)
    agent = make_agent(tokenizer, engine, client, agent_cfg(mode="async"))
    with pytest.raises(RetrievalError, match=own_service.url.replace(".", r"\.")):
        agent.run(prompts, GREEDY)
    assert threading.active_count() < 20  # the rollout's thread pool was shut down


def test_async_seeds_depend_on_the_row_not_on_its_neighbours(tokenizer, make_engine, service_url):
    """Each engine call carries one seed per row, derived from (seed, row, turn, chunk): the same row batched
    differently (one engine, or spread over two) gets the same seed for the same turn, and no two turns share one."""
    def seeds_by_context(calls) -> dict[tuple[int, ...], int]:
        seeds = {}
        for contexts, params in calls:
            assert params.row_seeds is not None and len(params.row_seeds) == len(contexts)
            seeds.update((tuple(c), s) for c, s in zip(contexts, params.row_seeds, strict=True))
        return seeds

    sampled = SamplingParams(max_tokens=1, temperature=1.0, seed=11)
    engine, prompts = make_engine(MIXED)
    make_agent(tokenizer, engine, CountingClient(service_url, TOPK), agent_cfg(mode="async")).run(
        prompts, sampled)
    pool = TwoEngines([make_engine(MIXED)[0], make_engine(MIXED)[0]])
    make_agent(tokenizer, pool, CountingClient(service_url, TOPK), agent_cfg(mode="async")).run(
        prompts, sampled)
    one, two = seeds_by_context(engine.calls), seeds_by_context(pool.engines[0].calls + pool.engines[1].calls)
    assert len(one) == sum(len(turns) for turns in MIXED.values())  # every turn of every row
    assert one == two and len(set(one.values())) == len(one)
