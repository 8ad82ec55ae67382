"""Search-R1's length semantics (docs/design.md, "Lengths"): per-turn response, start prompt, context, observation
block and the trajectory budget, with real-sized passages from the real retrieval service and Qwen2.5's tokenizer.

Guards against issue 37's bug: ``data.max_response_length`` bounding the whole trajectory, so that Search-R1's 500
left no room for the first ``<information>`` block and the policy never saw a passage, silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from search_r1.config import SearchConfig
from search_r1.llm_agent.formatting import INVALID_ACTION_FEEDBACK, information_block
from search_r1.search.client import RetrievalClient
from tests.search_r1.agent_settings import make_agent
from tests.search_r1.llm_agent.conftest import ScriptedEngine
from verl.agent.trajectory import CONTEXT_BUDGET, TRAJECTORY_BUDGET, TURN_BUDGET, StopReason
from verl.config import load_config
from verl.workers.rollout.base import SamplingParams

TOPK = 3
GREEDY = SamplingParams(max_tokens=1, temperature=0.0)
# Search-R1's train_ppo.sh / train_grpo.sh lengths (seeds 000/003), as command-line overrides.
SEARCH_R1_OVERRIDES = ["data.max_prompt_length=4096", "data.max_response_length=500", "data.max_start_length=2048",
                       "data.max_obs_length=500", "max_turns=2", f"retriever.topk={TOPK}"]
SCRIPTS = {
    "<|im_start|>user\ntwo searches<|im_end|>\n": [
        "<think> I need the capital first. </think><search> capital of France Paris </search>",
        "<think> Now the river. </think><search> Nile river Africa </search>",
        "<think> Both found. </think><answer> Paris </answer>"],
    "<|im_start|>user\nrambles first<|im_end|>\n": [
        "<think>" + " and so on" * 200 + " </think>",  # over 500 tokens: cut at max_response_length
        "<search> Marie Curie Nobel </search>",
        "<answer> Warsaw </answer>"],
    "<|im_start|>user\nanswers at once<|im_end|>\n": ["<think> I know. </think><answer> Tokyo </answer>"],
}


@dataclass
class Turn:
    tokens: int  # what the policy writes, uncut
    action: str  # search | answer | none


def search_r1_segments(prompt_len: int, turns: list[Turn], obs_lens: list[int], feedback_len: int, *, P: int,
                       R: int, S: int, OBS: int, max_turns: int) -> list[tuple[int, int]]:
    """Search-R1's run_llm_loop, its token accounting only -> [(tokens, 1 = sampled / 0 = inserted)] of the response.

    Per turn the engine samples at most ``max_response_length`` (R) tokens; a turn cut there has no action (its
    postprocess finds no closing tag): invalid, feedback. A search's observation is cut to ``max_obs_length``
    (OBS).
    The rolling context is left-cut to ``max_prompt_length`` (P) and the right side (the response) right-cut to P;
    the prompt is cut to ``max_start_length`` (S). After ``max_turns`` turns one final turn runs without search."""
    rolling = min(prompt_len, S)
    right: list[tuple[int, int]] = []
    searches = iter(obs_lens)
    for step, turn in enumerate(turns):
        sampled = min(turn.tokens, R)
        right.append((sampled, 1))
        action = turn.action if sampled == turn.tokens else "none"
        if step == max_turns or action == "answer":
            break
        inserted = min(next(searches), OBS) if action == "search" else feedback_len
        right.append((inserted, 0))
        rolling = min(rolling + sampled + inserted, P)
    out, total = [], 0
    for n, kind in right:  # _update_right_side: responses[:, :max_prompt_length]
        n = min(n, P - total)
        if n > 0:
            out.append((n, kind))
        total += n
    return out


def segments(info_mask: list[int]) -> list[tuple[int, int]]:
    """Runs of equal info_mask values -> [(length, value)]."""
    runs: list[tuple[int, int]] = []
    for m in info_mask:
        if runs and runs[-1][1] == m:
            runs[-1] = (runs[-1][0] + 1, m)
        else:
            runs.append((1, m))
    return runs


def run_scripts(tokenizer, url, cfg: SearchConfig, scripts=SCRIPTS):
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in scripts]
    engine = ScriptedEngine(tokenizer, {tuple(p): t for p, t in zip(prompts, scripts.values(), strict=True)})
    agent = make_agent(tokenizer, engine, RetrievalClient(url, TOPK), cfg)
    return prompts, agent.run(prompts, GREEDY)


def test_search_r1_overrides_give_search_r1_shaped_trajectories(qwen_tokenizer, long_service_url):
    """Search-R1's overrides must give the trajectories Search-R1 gives: a 2-search trajectory with real-sized
    passages keeps both blocks (the bug: no block fitted a 500-token whole-response budget), a turn cut at the
    per-turn budget gets feedback and goes on, and every segment has Search-R1's length."""
    tok = qwen_tokenizer
    cfg = load_config(SEARCH_R1_OVERRIDES)
    assert (cfg.data.max_response_length, cfg.data.max_trajectory_length, cfg.data.max_prompt_length) == \
        (500, 4096, 4096)
    prompts, result = run_scripts(tok, long_service_url, cfg)
    client = RetrievalClient(long_service_url, TOPK)
    feedback_len = len(tok(INVALID_ACTION_FEEDBACK, add_special_tokens=False)["input_ids"])
    for prompt, script, traj in zip(prompts, SCRIPTS.values(), result.trajectories, strict=True):
        turns, obs_lens = [], []
        for text in script:
            action = "answer" if text.endswith("</answer>") else "search" if text.endswith("</search>") else "none"
            turns.append(Turn(len(tok(text, add_special_tokens=False)["input_ids"]), action))
            if action == "search":
                query = text[text.rindex("<search>") + 8:-len("</search>")].strip()
                block = information_block(client.search([query])[0])
                obs_lens.append(len(tok(block, add_special_tokens=False)["input_ids"]))
        expected = search_r1_segments(len(prompt), turns, obs_lens, feedback_len, P=4096, R=500, S=2048, OBS=500,
                                      max_turns=2)
        assert segments(traj.info_mask) == expected
        assert traj.stop_reason is StopReason.ANSWERED and traj.cut_by is None
    two, rambles, _ = result.trajectories
    assert two.num_searches == 2 and all(430 <= n <= 500 for n, m in segments(two.info_mask) if m == 0)
    assert rambles.turns_cut == 1 and rambles.num_searches == 1 and rambles.num_invalid == 1
    metrics = result.metrics()
    assert metrics["agent/obs_tokens_per_traj"] > 300 and metrics["agent/cut/max_response_length"] == 1
    assert metrics["agent/cut/max_trajectory_length"] == 0 and metrics["agent/stop/max_length"] == 0


@pytest.mark.parametrize(("overrides", "budget"), [
    # Search-R1's 500 as a whole-trajectory budget (the bug's setting): the blocks no longer fit
    ({"max_trajectory_length": 500}, TRAJECTORY_BUDGET),
    # a context budget a prompt and one block exhaust: the second block is refused
    ({"max_prompt_length": 600, "max_start_length": 600}, CONTEXT_BUDGET),
    # a per-turn budget below what the policy writes before acting: every turn is cut
    ({"max_response_length": 12}, TURN_BUDGET),
])
def test_a_budget_that_costs_searches_or_answers_is_counted_and_named(qwen_tokenizer, long_service_url, caplog,
                                                                      overrides, budget):
    """Every trajectory cut for length is counted under its budget, and a warning names the key when more than
    LENGTH_WARN_FRAC of the rows lost a search or an answer to it, whichever budget it is."""
    cfg = load_config(SEARCH_R1_OVERRIDES + [f"data.{key}={value}" for key, value in overrides.items()])
    scripts = {k: v for k, v in SCRIPTS.items() if "two searches" in k}
    scripts.update({k.replace("two searches", f"two searches {i}"): v for i in range(3) for k, v in scripts.items()})
    with caplog.at_level(logging.WARNING, logger="verl.agent.loop"):
        _, result = run_scripts(qwen_tokenizer, long_service_url, cfg, scripts)
    key = budget.split(".")[-1]
    assert result.metrics()[f"agent/cut/{key}"] >= len(scripts)
    if budget != TURN_BUDGET:
        assert all(t.stop_reason is StopReason.MAX_LENGTH and t.cut_by == budget for t in result.trajectories)
        assert all(t.num_searches < 2 for t in result.trajectories)
    named = [r.getMessage() for r in caplog.records if f"{budget}=" in r.getMessage()]
    assert len(named) == 1, [r.getMessage() for r in caplog.records]
