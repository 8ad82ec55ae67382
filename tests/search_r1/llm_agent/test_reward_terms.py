"""Reward terms on trajectories made by the real loop: scripted policy turns, the real retrieval service's passages.

Both tokenizers (the tiny one, where tags are single tokens, and Qwen2.5's, where they merge with neighbours).
Each row is built to tell one case apart: a search that found the answer and an answer taken from it; a search that
found nothing useful and a memorised correct answer; an invalid action (feedback inserted) before a search; an
answer with no search at all.
"""

from __future__ import annotations

import numpy as np
import pytest

from search_r1.reward.qa_em import compute_score
from search_r1.reward.terms import TERMS, Context, TermsReward, Trajectory, Turn, contains, trajectories
from search_r1.search.client import RetrievalClient
from tests.search_r1.agent_settings import make_agent, search_config
from verl.algorithms.turn_credit import place_turn_rewards, turn_index
from verl.protocol import Batch
from verl.trainer.reward import RewardManager
from verl.utils.seq import pack_trajectories
from verl.workers.rollout.base import SamplingParams

CFG = search_config(max_turns=3, max_start_length=64, max_prompt_length=564, max_response_length=500,
                    max_trajectory_length=500,
                    max_obs_length=300, do_search=True, topk=2)
SCRIPTS = {  # prompt -> the policy's turns; gold answers below
    "Question: capital of France?": ["<search> capital of France </search>", "<answer> Paris </answer>"],
    "Question: capital of Germany?": ["<search> Nile river Africa </search>", "<answer> Berlin </answer>"],
    "Question: where is Everest?": ["<think> hm </think> no opening tag </search>",
                                    "<search> highest mountain </search>", "<answer> Himalayas </answer>"],
    "Question: largest city of Japan?": ["<answer> Tokyo </answer>"],
}
GOLD = [["Paris"], ["Berlin"], ["the Himalayas"], ["Tokyo"]]


@pytest.fixture
def batch(tokenizer, make_engine, service_url):
    engine, prompts = make_engine(SCRIPTS)
    result = make_agent(tokenizer, engine, RetrievalClient(service_url, 2), CFG).run(
        prompts, SamplingParams(max_tokens=1, temperature=0.0))
    trajs = result.trajectories
    tensors = pack_trajectories([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                                [t.info_mask for t in trajs], tokenizer.pad_token_id)
    tensors["loss_mask"] = tensors["response_mask"] * tensors["info_mask"]
    return Batch(tensors, {"data_source": np.array(["nq"] * 4, dtype=object),
                           "ground_truth": [{"target": g} for g in GOLD], "extra_info": [{}] * 4})


def test_terms_on_real_trajectories(tokenizer, batch):
    """Guards against a hit credited to the wrong turn (the feedback turn of row 2 shifts its search to turn 1), a
    turn that did not search scored as a miss, a memorised answer counted as grounded, a question not recovered
    from the prompt, and the default reward drifting from Search-R1's compute_score."""
    texts = [tokenizer.decode(ids[m.bool()].tolist(), skip_special_tokens=True)
             for ids, m in zip(batch["responses"], batch["response_mask"], strict=True)]
    trajs = trajectories(batch, tokenizer, texts)
    assert [len(t.turns) for t in trajs] == [2, 2, 3, 1]
    assert [t.turns[0].query for t in trajs] == ["capital of France", "Nile river Africa", None, None]
    assert trajs[2].turns[1].query == "highest mountain" and "not valid" in trajs[2].turns[0].inserted
    assert "Paris" in trajs[0].turns[0].passages[0] and len(trajs[0].turns[0].passages) == 2
    assert trajs[0].question == "capital of France?"

    reward = TermsReward({"em": 1.0, "retrieval_hit": 0.5}, "retrieval_hit", "squad")
    details = reward(batch, texts, tokenizer)
    terms = details.row_terms
    assert terms["reward/em"].tolist() == [1, 1, 1, 1]
    assert terms["reward/retrieval_hit"].tolist() == [1, 0, 1, 0]
    assert terms["reward/grounding"].tolist() == [1, 0, 1, 0]
    assert terms["reward/em_ungrounded"].tolist() == [0, 1, 0, 1]  # Berlin and Tokyo came from memory
    assert terms["reward/format"].tolist() == [1, 1, 0, 1]  # row 2's invalid turn breaks the format
    nan = float("nan")  # a turn that did not search (an answer, an invalid action) is not scored
    np.testing.assert_equal(details.turn_scores, [[1.0, nan], [0.0, nan], [nan, 1.0, nan], [nan]])
    assert details.scores.tolist() == [1.5, 1.0, 1.5, 1.0]

    # the turn scores land on the last policy token of the turn that searched, never on an inserted token
    policy = batch["response_mask"] * batch["info_mask"]
    placed = place_turn_rewards(details.turn_scores, policy)
    for row, turn in ((0, 0), (2, 1)):
        (pos,) = placed[row].nonzero().flatten().tolist()
        assert turn_index(policy)[row, pos] == turn
        assert policy[row, pos] == 1 and policy[row, pos + 1] == 0  # an inserted block follows
        assert tokenizer.decode(batch["responses"][row][:pos + 1].tolist()).rstrip().endswith("</search>")
    assert not placed[policy == 0].any()

    default = RewardManager(tokenizer, compute_score, TermsReward(None, None, "squad"))(batch)[1]
    assert default.tolist() == [compute_score("nq", t, {"target": g}) for t, g in zip(texts, GOLD, strict=True)]


def test_term_registry_and_matching():
    """Guards against substring matches inside words ("4" in "1945") and unknown names passing silently."""
    assert contains("Born in 1945 in Paris.", "paris", "squad") and not contains("Born in 1945.", "4", "squad")
    assert not contains("anything", "the", "squad")  # an answer that normalises to nothing matches nothing
    with pytest.raises(ValueError, match="unknown reward term 'nope': valid are em, subem, f1"):
        TermsReward({"nope": 1.0}, None, "squad")
    t = Trajectory([Turn("<answer> paris </answer>", "")], "<answer> paris </answer>", ["Paris"], "nq")
    assert TERMS.get("f1")([t], Context()).outcome.tolist() == [1.0]


def test_retrieval_hit_pays_once_per_passage():
    """Guards against the hack measured in the ablations: a search repeated to get the same passage again scored a
    second hit, so turn credit paid the policy to search until max_turns. Only a passage no earlier turn retrieved
    counts; a new passage with the answer still counts in a later turn."""
    doc = "\"Paris\"\nParis is the capital of France."
    other = "\"Lyon\"\nLyon is a city in France."
    info = "\n\n<information>Doc 1(Title: {})</information>\n\n"
    turns = [Turn("<search> capital of France </search>", info.format(doc)),
             Turn("<search> capital city France </search>", info.format(doc)),  # the same passage again
             Turn("<search> French cities </search>", info.format(other)),
             Turn("<answer> Paris </answer>", "")]
    t = Trajectory(turns, "", ["Paris"], "nq")
    got = TERMS.get("retrieval_hit")([t], Context())
    np.testing.assert_equal(got.turns, [[1.0, 0.0, 0.0, float("nan")]])
    assert got.outcome.tolist() == [1.0]
    late = Trajectory([turns[2], Turn("<search> capital of France </search>", info.format(doc)), turns[3]], "",
                      ["Paris"], "nq")
    np.testing.assert_equal(TERMS.get("retrieval_hit")([late], Context()).turns, [[0.0, 1.0, float("nan")]])


def test_retrieval_hit_reads_hermes_search_calls_and_tool_responses():
    """Guards against the retrieval_hit and grounding terms seeing no search in a hermes-format trajectory: the
    query is the turn's search tool call, the passages those of its tool message (search_r1.tools.format_hits)."""
    call = '<tool_call>{"name": "search", "arguments": {"query": "capital of France"}}</tool_call>'
    inserted = ("\n<|im_start|>user\n<tool_response>\nDoc 1 (id: p, Title: Paris) Paris is the capital of France.\n"
                "Doc 2 (id: l, Title: Lyon) Lyon is a city.\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    turn = Turn(call, inserted)
    assert turn.query == "capital of France"
    assert turn.passages == ["Paris) Paris is the capital of France.", "Lyon) Lyon is a city."]
    t = Trajectory([turn, Turn("<answer> Paris </answer>", "")], "", ["Paris"], "nq")
    np.testing.assert_equal(TERMS.get("retrieval_hit")([t], Context()).turns, [[1.0, float("nan")]])
