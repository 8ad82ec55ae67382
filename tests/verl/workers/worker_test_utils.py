"""Shared by the worker and worker-group tests: the tiny real model, a small config, random trajectories.

The fixtures are defined here and imported by the ``conftest.py`` of ``tests/verl/workers`` and
``tests/verl/single_controller`` (nothing is autouse, so other tests are not affected).

Trajectories look like the search agent's: left-padded prompts, right-padded responses of varying
length, and in most responses a hole of tokens inserted by the environment (info_mask = 0).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from data_prep.tiny_model import build_model, save_tiny_model
from search_r1.llm_agent.formatting import INVALID_ACTION_FEEDBACK, observation_ids
from verl.config import DEMO_CONFIG, Config, load_config
from verl.protocol import Batch
from verl.utils.seq import pack_trajectories
from verl.workers.actor import ActorWorker

TEXTS = ["<think> which city is the capital </think> <search> capital of France </search> "
         "<information> Paris is the capital of France. </information> <answer> Paris </answer>"] * 20
PAD_ID = 0


def build_tiny_model(out_dir: Path) -> Path:
    """The project's tiny Qwen2 model (hidden 128, 2 layers) with a small BPE vocabulary."""
    return save_tiny_model(out_dir, TEXTS, vocab_size=320)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Qwen2 model + tokenizer (real weights, random init)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def qwen_model_dir(tmp_path_factory, qwen_tokenizer) -> Path:
    """A saved tiny Qwen2 model (hidden 64, 1 layer, random init) with Qwen2.5's real 151,665-id vocabulary."""
    out = tmp_path_factory.mktemp("qwen_vocab_model")
    build_model(qwen_tokenizer, hidden_size=64, num_layers=1, num_heads=1, intermediate_size=128,
                max_positions=512).save_pretrained(out)
    qwen_tokenizer.save_pretrained(out)
    return out


def real_vocab_batch(tokenizer) -> Batch:
    """Agent-loop trajectories on a real vocabulary: the sampled turns end in a multi-token ``</search>`` or
    ``</answer>`` (one whose last token ``>\n\n`` spills past the tag), and the inserted blocks start with
    ``\n\n``, which would merge with the sampled ``>`` if the text were re-tokenised."""
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    docs = [{"id": "p", "contents": '"Paris"\nParis is the capital of France.'}]
    (block, _), = observation_ids(tokenizer, [docs], 64)
    rows = [["<think> look </think>\n<search> capital of France </search>", block, "<answer> Paris </answer>"],
            ["<search> France </search>\n\n", block, "<think> ok </think>", INVALID_ACTION_FEEDBACK,
             "<answer> Paris </answer>"],
            ["<answer> Lyon </answer>"]]
    prompts, responses, info_masks = [], [], []
    for parts in rows:
        prompts.append(tokenizer.apply_chat_template([{"role": "user", "content": "Capital of France?"}],
                                                     add_generation_prompt=True, tokenize=True, return_dict=False))
        response, mask = [], []
        for part in parts:
            inserted = isinstance(part, list) or part == INVALID_ACTION_FEEDBACK
            ids = part if isinstance(part, list) else encode(part)
            response += ids
            mask += [0 if inserted else 1] * len(ids)  # 1 = sampled by the policy (trained), 0 = inserted
        responses.append(response)
        info_masks.append(mask)
    tensors = pack_trajectories(prompts, responses, info_masks, tokenizer.pad_token_id)
    tensors["loss_mask"] = tensors["response_mask"] * tensors["info_mask"]
    return Batch(tensors, {"uid": [f"u{i}" for i in range(len(rows))]})


def make_config(model_dir: Path, *overrides: str) -> Config:
    """A validated config for 8-row batches on CPU; ``overrides`` are ``key=value`` strings."""
    base = [
        f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu", "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "critic.ppo_mini_batch_size=8", "critic.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "critic.optim.lr=1e-3", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    ]
    return load_config(base + list(overrides), [DEMO_CONFIG])


def random_batch(seed: int, rows: int = 8, vocab: int = 300) -> Batch:
    """Packed random trajectories with inserted holes; ``loss_mask = response_mask * info_mask`` (state masking)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))] for _ in range(rows)]
    responses = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 14))] for _ in range(rows)]
    info_masks = []
    for response in responses:
        start = rng.randrange(len(response))
        hole = range(start, start + rng.randint(0, 4))  # tokens inserted by the environment
        info_masks.append([0 if j in hole else 1 for j in range(len(response))])
    tensors = pack_trajectories(prompts, responses, info_masks, PAD_ID)
    tensors["loss_mask"] = tensors["response_mask"] * tensors["info_mask"]  # 1 = sampled by the policy (trained)
    return Batch(tensors, {"uid": [f"u{i}" for i in range(rows)]})


def add_targets(batch: Batch, seed: int) -> Batch:
    """Random ``advantages``, ``returns``, ``values``, ``old_log_probs``, ``ref_log_prob`` [B, R] where absent."""
    gen = torch.Generator().manual_seed(seed)
    shape = batch["responses"].shape
    randoms = {"advantages": torch.randn(shape, generator=gen), "returns": torch.randn(shape, generator=gen),
               "values": 0.3 * torch.randn(shape, generator=gen),
               "old_log_probs": -6.0 + 0.1 * torch.randn(shape, generator=gen)}
    out = Batch({**randoms, **batch.tensors}, dict(batch.non_tensors), dict(batch.meta))
    if "ref_log_prob" not in out:
        out.tensors["ref_log_prob"] = out["old_log_probs"] + 0.05 * torch.randn(shape, generator=gen)
    return out


def perturb_masked(batch: Batch, seed: int) -> Batch:
    """The same batch with every per-token target replaced by large noise where loss_mask = 0."""
    gen = torch.Generator().manual_seed(seed)
    out = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
    hidden = batch["loss_mask"] == 0
    for key in ("advantages", "old_log_probs", "ref_log_prob", "returns", "values"):
        noise = 50 * torch.randn(batch[key].shape, generator=gen)
        out.tensors[key] = torch.where(hidden, noise, batch[key])
    return out


def saved_and_resumed(cfg: Config, path: Path) -> tuple[ActorWorker, ActorWorker]:
    """(original, resumed) actor workers: the original made one update (seed-8 batch) and saved a checkpoint under
    ``path``; the resumed one is a fresh worker that loaded it. Their next updates are the test's to compare."""
    original = ActorWorker(cfg, total_steps=4)
    original.update_actor(add_targets(random_batch(seed=8), seed=8))
    original.save_checkpoint(str(path))
    resumed = ActorWorker(cfg, total_steps=4)
    resumed.load_checkpoint(str(path))
    return original, resumed


def parameters(worker) -> dict[str, torch.Tensor]:
    """A detached copy of a worker's (unsharded) parameters."""
    return {name: p.detach().clone() for name, p in worker.model.named_parameters()}


def assert_equal_parameters(a, b) -> None:
    """Two workers' parameters are bit-for-bit equal (named on failure)."""
    theirs = parameters(b)
    for name, value in parameters(a).items():
        assert torch.equal(value, theirs[name]), name


def capture_outputs(module: torch.nn.Module) -> list[torch.Tensor]:
    """Outputs of ``module``'s forward calls from now on, appended to the returned list, with ``.grad`` kept."""
    outputs: list[torch.Tensor] = []

    def keep_grad(_module, _args, out):
        out.retain_grad()
        outputs.append(out)

    module.register_forward_hook(keep_grad)
    return outputs


def gradients(worker) -> dict[str, torch.Tensor]:
    """A copy of the gradients of a worker's last optimiser step (after clipping)."""
    return {name: p.grad.detach().clone() for name, p in worker.model.named_parameters()}


def assert_same_update(a: tuple[dict, dict, dict], b: tuple[dict, dict, dict]) -> None:
    """(metrics, parameters, gradients) of two workers agree up to float rounding.

    Gradients are compared tightly; weights loosely (Adam divides by sqrt(v): on near-zero gradients
    it turns rounding into differences of a few % of lr, 4 % measured when token-budget micro-batches
    regroup rows by length); metrics (pg_loss, grad_norm) catch a wrong overall scale, which Adam's
    weights alone would hide.
    """
    assert a[0].keys() == b[0].keys()
    for key, value in a[0].items():
        assert value == pytest.approx(b[0][key], rel=1e-4, abs=1e-6), key
    for key, value in a[2].items():
        torch.testing.assert_close(value, b[2][key], atol=1e-6, rtol=1e-4)
    for key, value in a[1].items():
        torch.testing.assert_close(value, b[1][key], atol=1e-4, rtol=1e-5)
