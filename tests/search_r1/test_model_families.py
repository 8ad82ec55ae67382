"""Any Hugging Face causal LM, as users bring it (issue 40): for each family of ``model_families`` (Llama 3, Qwen2.5,
Qwen3, Gemma 3, Mistral, a base model with no chat template), built here with no downloads, the prompt as the
policy sees it, the search loop with the transformers engine against the real retrieval service, its masks, one
GRPO step through the trainer, and the checkpoint saved and loaded again.

The policies are tiny random models that memorised a search-then-answer trajectory per question
(``memorised_policy``), so a greedy rollout has one right answer, token for token.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_prep.qa_search import make_row, rows_to_parquet
from search_r1.llm_agent.generation import StopReason
from search_r1.prompts import INSTRUCTION, make_prompt
from search_r1.search.client import RetrievalClient
from tests.entry_points import main_ppo_in_process
from tests.search_r1.agent_settings import make_agent, search_config
from tests.search_r1.memorised_policy import QUESTIONS, TOPK, memorised_policy
from tests.search_r1.model_families import FAMILIES, build_model, build_tokenizer
from verl.utils.dataset import PromptDataset
from verl.utils.tokenizer import pad_token_id, render_prompt
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

MAX_OBS = 160  # one <information> block of TOPK passages, in the small vocabularies' tokens
LOOP = search_config(max_turns=2, max_start_length=256, max_prompt_length=640, max_response_length=64,
                     max_trajectory_length=320, max_obs_length=MAX_OBS, do_search=True, topk=TOPK)
SCRIPT_TEXTS = ["<think> I need to search </think><search> capital of France </search>",
                "<think> found it </think><answer> Paris </answer>"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_tokenizer(request, corpus_texts):
    """(family, its tokenizer, trained here in the family's shape)."""
    family = FAMILIES[request.param]
    texts = corpus_texts + [INSTRUCTION] * 3 + list(QUESTIONS) * 3 + SCRIPT_TEXTS * 3
    return family, build_tokenizer(family, texts)


def test_prompt_is_rendered_as_the_family_expects(family_tokenizer, tmp_path):
    """Guards against the dataset's "chat_template is not set" traceback on a base model, a doubled bos (a template
    that writes bos, tokenised by a tokenizer that adds one too), a dropped system prompt that a template inserts,
    and a missing pad id: the dataset's prompt ids are ``render_prompt``'s; a base model's prompt is its text after
    bos; a prompt starts with bos once where the family has one; the padding id is pad, else eos."""
    family, tokenizer = family_tokenizer
    question = next(iter(QUESTIONS))
    rows = [make_row("toy", question, ["Paris"], "train", 0)]
    rows_to_parquet(rows, tmp_path / "train.parquet")
    dataset = PromptDataset(str(tmp_path / "train.parquet"), tokenizer, max_prompt_length=1024)
    ids = render_prompt(tokenizer, rows[0]["prompt"])
    assert dataset.prompt_ids == [ids]
    text = tokenizer.decode(ids)
    if family.template is None:
        assert text == f"{family.bos} {make_prompt(question)}" or text == family.bos + make_prompt(question)
        # a prompt text that starts with the bos literal itself (data written for another pipeline): bos once
        again = render_prompt(tokenizer, [{"role": "user", "content": family.bos + make_prompt(question)}])
        assert again[0] == tokenizer.bos_token_id and again.count(tokenizer.bos_token_id) == 1
    else:
        assert make_prompt(question).strip() in text
    bos = tokenizer.bos_token_id
    if family.bos is not None:
        assert ids[0] == bos and ids.count(bos) == 1
    if family.name == "qwen2":
        assert text.startswith("<|im_start|>system\nYou are Qwen")  # the template's own system prompt, kept
    expected_pad = tokenizer.eos_token_id if family.pad is None else tokenizer.convert_tokens_to_ids(family.pad)
    assert pad_token_id(tokenizer) == expected_pad


@pytest.fixture(scope="module")
def family_policy(family_tokenizer, tmp_path_factory, service_url):
    """(family, model dir, tokenizer, prompts, expected responses, expected info masks): the family's tiny model,
    memorised on the trajectories of ``QUESTIONS`` with the passages the service returns."""
    family, tokenizer = family_tokenizer
    out = tmp_path_factory.mktemp(f"policy_{family.name}")
    model = build_model(family, tokenizer)
    return (family, *memorised_policy(tokenizer, out, service_url, model=model, max_obs_length=MAX_OBS))


@pytest.mark.slow
def test_search_loop_reproduces_the_memorised_trajectories(family_policy, service_url):
    """Guards against a loop or engine that works for one family only (stop strings split over several tokens or
    merged with a newline, another eos, pad = eos or no pad, a bos the model needs): greedy rollouts through the
    transformers engine equal the memorised ids token for token, the inserted passages carry info_mask 0 and the
    sampled tokens 1, and each row searches once and answers."""
    family, model_dir, tokenizer, prompts, responses, masks = family_policy
    engine = HFRollout(str(model_dir), dtype="float32", device="cpu", micro_batch_size=8, seed=0)
    agent = make_agent(tokenizer, engine, RetrievalClient(service_url, TOPK), LOOP)
    result = agent.run(prompts, SamplingParams(max_tokens=1, temperature=0.0))
    for traj, response, mask in zip(result.trajectories, responses, masks, strict=True):
        assert traj.response_ids == response, (tokenizer.decode(traj.response_ids), tokenizer.decode(response))
        assert traj.info_mask == mask and 0 in mask
        inserted = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if m == 0])
        assert inserted.strip().startswith("<information>") and inserted.strip().endswith("</information>")
        assert traj.stop_reason is StopReason.ANSWERED and traj.num_searches == 1 and traj.num_turns == 2


@pytest.mark.slow
def test_one_grpo_step_then_the_checkpoint_loads(family_policy, service_url, tmp_path):
    """Guards against a family the trainer cannot train or save (untied heads, Gemma's text-only class, a tokenizer
    with no pad or no chat template): one GRPO step with search exits 0 and searched; a rerun of the finished run
    loads its checkpoint (exit 0, nothing trained again); the exported ``hf_model`` loads as the same class with
    the same head tying, its weights are the step's (not the starting ones), and its tokenizer renders the same
    prompts."""
    family, model_dir, tokenizer, prompts, *_ = family_policy
    rows = [make_row("toy", q, [a], "train", i) for i, (q, (_, a)) in enumerate(QUESTIONS.items())]
    rows_to_parquet(rows, tmp_path / "train.parquet")
    out = tmp_path / "run"
    args = ["--config", "configs/grpo.yaml",
            f"data.train_files={tmp_path / 'train.parquet'}", f"data.val_files={tmp_path / 'train.parquet'}",
            f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=hf",
            f"retriever.url={service_url}", f"retriever.topk={TOPK}", f"max_turns={LOOP.max_turns}",
            "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", f"data.max_obs_length={MAX_OBS}",
            f"data.max_start_length={LOOP.data.max_start_length}",
            f"data.max_prompt_length={LOOP.data.max_prompt_length}",
            f"data.max_response_length={LOOP.data.max_response_length}",
            f"data.max_trajectory_length={LOOP.data.max_trajectory_length}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.entropy_coeff=0.01",  # a gradient even when a group's samples score alike
            "trainer.total_training_steps=1", "trainer.save_freq=1",
            "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out}", "trainer.device=cpu"]
    done = main_ppo_in_process(*args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1 and step["agent/searches_per_traj"] > 0, json.dumps(step)
    again = main_ppo_in_process(*args)
    assert again.returncode == 0 and "run already complete: 1 of 1 steps" in again.stdout, again.stdout[-2000:]

    saved = AutoModelForCausalLM.from_pretrained(out / "hf_model")
    start = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(saved) is family.model_class and saved.config.tie_word_embeddings is family.tied
    tied = saved.get_output_embeddings().weight.data_ptr() == saved.get_input_embeddings().weight.data_ptr()
    assert tied is family.tied
    assert any(not torch.equal(a, b) for a, b in zip(saved.state_dict().values(), start.state_dict().values(),
                                                      strict=True))
    saved_tokenizer = AutoTokenizer.from_pretrained(out / "hf_model")
    assert [render_prompt(saved_tokenizer, [{"role": "user", "content": make_prompt(q)}]) for q in QUESTIONS] \
        == prompts
