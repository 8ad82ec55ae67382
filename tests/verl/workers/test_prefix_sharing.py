"""The actor's and the reference's forwards with the shared prompt prefix run once (``shared_prefix.PrefixSharing``,
``actor.share_prompt_prefix``) against the same workers computing every row in full.

Guards against a worker whose sharing path drifts from the full forward (wrong positions, padding or cache: every
value would still look like a log-prob), against an update that trains different weights through the shared
prefix, and against the sharing path quietly never running (each test first asserts it does)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.verl.workers.worker_test_utils import (
    PAD_ID,
    add_targets,
    assert_same_update,
    gradients,
    make_config,
    parameters,
)
from verl.protocol import Batch
from verl.utils.seq import pack_trajectories
from verl.workers.actor import ActorWorker
from verl.workers.reference import RefWorker
from verl.workers.shared_prefix import MIN_PREFIX

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MICRO = ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1",
         "actor_rollout_ref.actor.entropy_coeff=0.01")


def grouped_batch(seed: int, vocab: int = 300) -> Batch:
    """Two GRPO groups of four rows: a 12-token instruction, a question per group (3-7 tokens), then responses of
    1-30 tokens with an inserted span (info mask 0); micro-batches of 4 rows then each hold one group."""
    rng = random.Random(seed)
    instruction = [rng.randrange(3, vocab) for _ in range(12)]
    prompts, responses, masks = [], [], []
    for _ in range(2):
        question = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 7))]
        for _ in range(4):
            length = rng.randint(1, 30)
            prompts.append(instruction + question)
            responses.append([rng.randrange(3, vocab) for _ in range(length)])
            start = rng.randrange(length)
            masks.append([0 if start <= k < start + 5 else 1 for k in range(length)])
    tensors = pack_trajectories(prompts, responses, masks, PAD_ID)
    tensors["loss_mask"] = tensors["response_mask"] * tensors["info_mask"]
    return Batch(tensors, {"uid": [f"g{i // 4}" for i in range(8)]})


def assert_shares(worker, batch: Batch) -> None:
    """The sharing path runs on every 4-row micro-batch of ``batch`` (the whole prompt but its last token)."""
    assert worker.prefix_sharing.enabled
    for start in (0, 4):
        assert worker.prefix_sharing.prefix(batch.index(list(range(start, start + 4)))) >= MIN_PREFIX + 6


def test_the_log_prob_pass_and_the_reference_equal_the_full_forward(tiny_model_dir):
    batch = grouped_batch(seed=0)
    shared = ActorWorker(make_config(tiny_model_dir, *MICRO), total_steps=1)
    full = ActorWorker(make_config(tiny_model_dir, *MICRO, "actor_rollout_ref.actor.share_prompt_prefix=false"),
                       total_steps=1)
    assert_shares(shared, batch)
    assert not full.prefix_sharing.enabled
    got, want = shared.compute_log_prob(batch), full.compute_log_prob(batch)
    for key in ("old_log_probs", "entropy"):
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=1e-5, msg=key)
    assert torch.all(got["old_log_probs"][batch["response_mask"] == 0] == 0)

    ref = RefWorker(make_config(tiny_model_dir, *MICRO), total_steps=1)
    assert_shares(ref, batch)
    torch.testing.assert_close(ref.compute_ref_log_prob(batch)["ref_log_prob"], want["old_log_probs"],
                               atol=1e-5, rtol=1e-5)


def test_an_update_through_the_shared_prefix_trains_the_same_weights(tiny_model_dir):
    """Policy loss, KL loss and an entropy bonus (its gradient through the prefix too), one mini-batch of two
    micro-batches, on-policy (no old log-probs: the update's own forward gives them) and with old log-probs."""
    batch = grouped_batch(seed=1)
    for on_policy in (True, False):
        targets = add_targets(batch, seed=3)
        if on_policy:
            targets = Batch({k: v for k, v in targets.tensors.items() if k != "old_log_probs"},
                            dict(targets.non_tensors))
        updates = []
        for share in ("true", "false"):
            cfg = make_config(tiny_model_dir, *MICRO, f"actor_rollout_ref.actor.share_prompt_prefix={share}")
            worker = ActorWorker(cfg, total_steps=1)
            before = parameters(worker)
            metrics = worker.update_actor(targets)
            if share == "true":
                assert_shares(worker, batch)
            after = parameters(worker)
            assert any(not torch.equal(after[n], before[n]) for n in after), "the update changed no weight"
            updates.append((metrics, after, gradients(worker)))
        assert_same_update(*updates)  # gradients tightly, weights as Adam's first step allows
