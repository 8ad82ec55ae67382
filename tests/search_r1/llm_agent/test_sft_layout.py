"""The SFT data's token layout is the RL loop's: the same turns, written as SFT rows and tokenised by the SFT trainer's
dataset, give the tensors the agent loop packs when a policy writes those turns against the real retrieval service
(ids, positions, masks), and the SFT loss mask is the RL trainer's ``response_mask * info_mask``."""

from __future__ import annotations

import pytest
import torch

from data_prep.cold_start import rows_to_sft_parquet, sft_row
from data_prep.qa_search import make_row, rows_to_parquet
from search_r1.llm_agent.formatting import feedback_turn, information_turn, policy_turn
from search_r1.search.client import RetrievalClient
from tests.search_r1.agent_settings import make_agent
from tests.search_r1.llm_agent.conftest import ScriptedEngine
from tests.search_r1.llm_agent.test_agent_loop import GREEDY, TOPK, agent_cfg
from verl.utils.dataset import PromptDataset
from verl.utils.sft_dataset import TrajectoryDataset

pytestmark = pytest.mark.slow  # the retrieval service runs in its own process

FEEDBACK = "feedback"
# question -> per turn, (what the policy writes, what the loop inserts after it: the query's passages, the
# invalid-action feedback, or nothing): two searches; an answer at once; an invalid turn, a search, an answer
SCRIPTS = {
    "Where is the Nile": [("<think> I should search </think><search> Nile river </search>", "Nile river"),
                          ("<think> again </think><search> Mediterranean Sea </search>", "Mediterranean Sea"),
                          ("<think> done </think><answer> Africa </answer>", None)],
    "What is the capital of Germany": [("<think> I know it </think><answer> Berlin </answer>", None)],
    "Who discovered polonium": [("<think> hm </think> no opening tag </search>", FEEDBACK),
                                ("<search> Marie Curie polonium </search>", "Marie Curie polonium"),
                                ("<answer> Marie Curie </answer>", None)],
}


def sft_turns(script: list[tuple[str, str | None]], client: RetrievalClient) -> list[dict]:
    """The SFT turns of a scripted trajectory, built as the cold start builds them (passages from the service)."""
    turns = []
    for text, inserted in script:
        turns.append(policy_turn(text))
        if inserted == FEEDBACK:
            turns.append(feedback_turn())
        elif inserted is not None:
            turns.append(information_turn(client.search([inserted])[0]))
    return turns


def test_sft_rows_have_the_rl_loops_tokens_and_masks(tokenizer, service_url, tmp_path):
    """Guards against an SFT layout that drifts from RL's (a template applied twice, special tokens added per turn,
    an EOS after the answer, passages rendered or tokenised differently, the loss on inserted or prompt tokens): for
    both tokenizers (tiny, and Qwen2.5's where tags are several tokens that merge with their neighbours) the SFT
    batch equals the agent loop's packed rollout of the same turns, and its loss mask is RL's."""
    client = RetrievalClient(service_url, TOPK)
    qa_rows = [make_row("toy", q, ["x"], "train", i) for i, q in enumerate(SCRIPTS)]
    rows_to_parquet(qa_rows, tmp_path / "rl.parquet")
    prompts = PromptDataset(str(tmp_path / "rl.parquet"), tokenizer, max_prompt_length=4096)
    engine = ScriptedEngine(tokenizer, {tuple(ids): [text for text, _ in script]
                                        for ids, script in zip(prompts.prompt_ids, SCRIPTS.values(), strict=True)})
    agent = make_agent(tokenizer, engine, client, agent_cfg(max_start_length=4096, max_prompt_length=4096,
                                                                      max_trajectory_length=2000))
    rl = agent(prompts.batch(range(len(qa_rows))), GREEDY)
    assert list(rl["stop_reason"]) == ["answered"] * 3 and list(rl["num_searches"]) == [2, 0, 1]

    rows = [sft_row(row, sft_turns(script, client)) for row, script in zip(qa_rows, SCRIPTS.values(), strict=True)]
    rows_to_sft_parquet(rows, tmp_path / "sft.parquet")
    sft = TrajectoryDataset(str(tmp_path / "sft.parquet"), tokenizer, max_length=8192).batch(range(len(rows)))

    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask", "info_mask"):
        assert torch.equal(sft[key], rl[key]), key
    loss_mask = rl["response_mask"] * rl["info_mask"]  # PPOTrainer.generate with actor.state_masking (the default)
    assert torch.equal(sft["loss_mask"], loss_mask)
    assert 0 < int(loss_mask.sum()) < int(rl["response_mask"].sum())  # the inserted blocks are context only
