"""The SFT trainer's shared-prompt-prefix forward (``verl/workers/shared_prefix.py``) against the actor's log-probs.

Guards against a prefix-sharing forward that gets positions, padding or the cache wrong (every value would still
look like a log-prob): on a micro-batch of rows with prompts of different lengths that share a prefix, the
log-probs of the response tokens and the gradients of their sum equal ``response_log_probs``' on the same batch,
for each model family (Gemma 3's sliding-window layers included: the rows are longer than its window)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.search_r1.model_families import FAMILIES, build_model, build_tokenizer
from verl.protocol import Batch
from verl.utils.seq import pack_trajectories
from verl.workers.model_utils import response_log_probs
from verl.workers.shared_prefix import batch_prefix_length, common_prefix_length, right_padded, shared_prefix_log_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rows(vocab: list[int], rng: random.Random) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Four rows: a 40-token shared prefix, 1-12 prompt tokens of their own, 0-70 response tokens with inserted
    spans (info mask 0)."""
    prefix = [rng.choice(vocab) for _ in range(40)]
    prompts, responses, masks = [], [], []
    for own, length in ((1, 70), (12, 3), (5, 45), (8, 1)):
        prompts.append(prefix + [rng.choice(vocab) for _ in range(own)])
        responses.append([rng.choice(vocab) for _ in range(length)])
        masks.append([0 if 10 <= k < 25 else 1 for k in range(length)])
    return prompts, responses, masks


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_shared_prefix_log_probs_equal_the_full_forward(name):
    family = FAMILIES[name]
    tokenizer = build_tokenizer(family, ["the guild of Vuzaholm was founded by Arlen Tosk in the north"] * 4)
    model = build_model(family, tokenizer).train()
    specials = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in specials]
    prompts, responses, masks = rows(vocab, random.Random(0))
    batch = Batch(pack_trajectories(prompts, responses, masks, tokenizer.pad_token_id or 0))
    p0 = batch_prefix_length(batch)
    assert p0 == common_prefix_length(prompts) == 40
    real = batch["response_mask"].float()  # [b, R]

    def run(fn) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        log_prob, entropy = fn()
        log_prob, entropy = log_prob * real, entropy * real
        (log_prob.sum() + 0.5 * entropy.sum()).backward()  # an entropy bonus: its gradient goes through the prefix too
        return (log_prob.detach(), entropy.detach(),
                {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    cpu = torch.device("cpu")
    full, full_entropy, full_grads = run(lambda: response_log_probs(model, batch, cpu, torch.float32, True, True))
    shared, shared_entropy, shared_grads = run(lambda: shared_prefix_log_probs(model, batch, p0, cpu, torch.float32,
                                                                                True, True))
    assert shared.shape == full.shape == real.shape
    torch.testing.assert_close(shared, full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(shared_entropy, full_entropy, rtol=1e-4, atol=1e-4)
    assert shared_grads.keys() == full_grads.keys() and full_grads
    for n in full_grads:
        torch.testing.assert_close(shared_grads[n], full_grads[n], rtol=1e-3, atol=1e-4, msg=n)


def test_the_rows_are_rebuilt_right_padded_with_their_tokens_in_order():
    """Each row's prompt then response from column 0, padding only at the end; the common prefix stops one token
    short of the shortest prompt."""
    prompts = [[7, 8, 9, 1], [7, 8, 9, 2, 3, 4], [7, 8, 9, 5]]
    responses = [[11, 12], [13], [14, 15, 16]]
    batch = Batch(pack_trajectories(prompts, responses, [[1] * len(r) for r in responses], 0))
    ids, mask, first, r = right_padded(batch)
    assert r == 3 and first.tolist() == [4, 6, 4] and ids.shape == (3, 7)
    for i, (p, resp) in enumerate(zip(prompts, responses, strict=True)):
        assert ids[i, :len(p) + len(resp)].tolist() == p + resp and mask[i].tolist() == [1] * (len(p) + len(resp)) + [
            0] * (7 - len(p) - len(resp))
    assert common_prefix_length(prompts) == 3  # at most the shortest prompt minus one
    assert common_prefix_length([[1, 2], [1, 2, 3]]) == 1
