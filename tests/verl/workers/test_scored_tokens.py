"""The LM head on the scored response tokens only (``verl/workers/scored_tokens.py``).

Guards against a log-prob pass that scores other tokens than it says, or computes them wrong once the head sees a
subset: on rows with retrieved spans (info mask 0), different prompt lengths and a shared prompt prefix, both
passes (``response_log_probs`` and ``shared_prefix_log_probs``) give, at every token ``loss_mask`` or the policy's
sampling marks, the log-prob and entropy of a plain forward with a full log-softmax (an oracle written here), 0 at
every other token, the same gradients, and the LM head was given exactly those tokens. Every model family, Gemma's
final soft-cap switched on (the code after the head runs on the subset)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.search_r1.model_families import FAMILIES, build_model, build_tokenizer
from tests.verl.workers.test_shared_prefix import rows
from verl.protocol import Batch
from verl.utils.seq import pack_trajectories
from verl.workers.model_utils import response_log_probs
from verl.workers.scored_tokens import ScoredTokens
from verl.workers.shared_prefix import batch_prefix_length, shared_prefix_log_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")


def make_batch(vocab: list[int], pad: int, state_masking: bool = True) -> Batch:
    """test_shared_prefix's four rows (a 40-token shared prefix, prompts of their own, responses with a retrieved
    span: info mask 0), with ``loss_mask`` as the recipe makes it (retrieved tokens out under state masking) and the
    last row's loss masked out whole (as the overlong filter does)."""
    tensors = pack_trajectories(*rows(vocab, random.Random(0)), pad)
    loss_mask = tensors["response_mask"] * (tensors["info_mask"] if state_masking else 1)
    loss_mask[3] = 0
    return Batch({**tensors, "loss_mask": loss_mask})


def oracle(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy [b, R] of every response position: the model's full logits, float32 log-softmax."""
    R = batch["responses"].shape[1]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], use_cache=False).logits[:, -R - 1:-1].float()  # [b, R, V]
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_prob = log_softmax.gather(-1, batch["responses"][..., None])[..., 0]
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_prob, entropy


def run(model, fn, scored: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    log_prob, entropy = fn()
    ((log_prob * scored).sum() + 0.5 * (entropy * scored).sum()).backward()  # the entropy bonus's gradient too
    return (log_prob.detach(), entropy.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_both_passes_score_exactly_the_read_tokens(name):
    family = FAMILIES[name]
    tokenizer = build_tokenizer(family, ["the guild of Vuzaholm was founded by Arlen Tosk in the north"] * 4)
    model = build_model(family, tokenizer).train()
    if hasattr(model.config, "final_logit_softcapping"):
        model.config.final_logit_softcapping = 3.0  # small enough to change every logit
    specials = set(tokenizer.all_special_ids)
    batch = make_batch([i for i in range(len(tokenizer)) if i not in specials], tokenizer.pad_token_id or 0)
    # read: loss_mask (rows 0-2's policy tokens) or sampled by the policy (row 3's too)
    scored = (batch["response_mask"] * batch["info_mask"]).float()  # [b, R]
    assert 0 < scored.sum() < batch["response_mask"].sum()
    head_rows = []
    hook = model.get_output_embeddings().register_forward_hook(  # runs after head_on's pre-hook: what the head got
        lambda module, args, out: head_rows.append(args[0].shape[:-1].numel()))
    want, want_entropy, want_grads = run(model, lambda: oracle(model, batch), scored)
    head_rows.clear()
    full = run(model, lambda: response_log_probs(model, batch, CPU, torch.float32, True, True), scored)
    full_rows = list(head_rows)
    head_rows.clear()
    p0 = batch_prefix_length(batch)
    assert p0 >= 40
    shared = run(model, lambda: shared_prefix_log_probs(model, batch, p0, CPU, torch.float32, True, True), scored)
    hook.remove()
    assert full_rows == [int(scored.sum())]  # the LM head saw the scored tokens, once
    assert head_rows == [1, int(scored.sum())]  # the prefix's one kept column, then the scored tokens
    for log_prob, entropy, grads in (full, shared):
        torch.testing.assert_close(log_prob, want * scored, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(entropy, want_entropy * scored, rtol=1e-4, atol=1e-4)
        assert grads.keys() == want_grads.keys() and want_grads
        for n in want_grads:
            torch.testing.assert_close(grads[n], want_grads[n], rtol=1e-3, atol=1e-4, msg=n)


def test_which_tokens_are_scored():
    """Read tokens: loss_mask or the policy's (response_mask x info_mask); every real one without a loss_mask (and
    with state masking off, where loss_mask holds the retrieved tokens too); one token when nothing is read."""
    batch = make_batch(list(range(10, 200)), 0)
    R = batch["responses"].shape[1]
    r = R - 1  # a pass that cut the last column (padding in every row but one)

    def as_mask(tokens: ScoredTokens) -> torch.Tensor:
        mask = torch.zeros((len(batch), r), dtype=torch.long)
        mask[tokens.rows, tokens.cols] = 1
        return mask

    policy = (batch["response_mask"] * batch["info_mask"])[:, :r]
    assert torch.equal(as_mask(ScoredTokens.of(batch, r, CPU)), policy)
    unmasked = Batch({k: v for k, v in batch.tensors.items() if k != "loss_mask"})
    assert torch.equal(as_mask(ScoredTokens.of(unmasked, r, CPU)), batch["response_mask"][:, :r])
    no_masking = make_batch(list(range(10, 200)), 0, state_masking=False)
    expected = no_masking["response_mask"][:, :r].clone()
    expected[3] = policy[3]  # row 3's loss is masked out: its policy tokens are still read (rollout/*)
    assert torch.equal(as_mask(ScoredTokens.of(no_masking, r, CPU)), expected)
    nothing = Batch({**batch.tensors, "loss_mask": torch.zeros_like(batch["loss_mask"]),
                     "info_mask": torch.zeros_like(batch["info_mask"])})
    placeholder = ScoredTokens.of(nothing, r, CPU)
    assert len(placeholder.rows) == 1 and placeholder.placeholder
    values = torch.tensor([-2.0], requires_grad=True)
    out = placeholder.scatter(values, len(batch), R)
    assert torch.all(out == 0) and out.requires_grad  # 0 everywhere, still a graph for an update's backward


def test_a_model_without_output_embeddings_gets_its_full_logits_gathered(monkeypatch):
    """Guards the fallback: where the head cannot be hooked, the scored tokens' values come from the full logits."""
    family = FAMILIES["llama"]
    tokenizer = build_tokenizer(family, ["the guild of Vuzaholm was founded by Arlen Tosk in the north"] * 4)
    model = build_model(family, tokenizer).eval()
    specials = set(tokenizer.all_special_ids)
    batch = make_batch([i for i in range(len(tokenizer)) if i not in specials], tokenizer.pad_token_id or 0)
    scored = (batch["response_mask"] * batch["info_mask"]).float()
    with torch.no_grad():
        hooked, _ = response_log_probs(model, batch, CPU, torch.float32)
        monkeypatch.setattr(model, "get_output_embeddings", lambda: None)
        gathered, _ = response_log_probs(model, batch, CPU, torch.float32)
        want, _ = oracle(model, batch)
    torch.testing.assert_close(gathered, want * scored, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hooked, gathered, rtol=1e-5, atol=1e-5)
