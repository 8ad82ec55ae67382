"""Dynamic sampling (DAPO): groups whose samples all scored the same are dropped and more are generated.

With a group estimator (GRPO, RLOO, ...) a group in which every sample of a prompt has the same score gets zero
advantage on every token: it adds nothing to the policy gradient and only dilutes the batch (early in training
most groups are all wrong, late most are all right). ``algorithm.filter_groups.enable`` (verl's key names) keeps
only the groups whose scores differ and generates further rounds of ``data.train_batch_size`` prompts until
``data.train_batch_size`` kept groups are collected or ``algorithm.filter_groups.max_num_gen_batches`` rounds
have run.

Choices:
- Where it runs: inside the function that makes a step's batch (``PPOTrainer._make_batch``), which the rollout
  (``pipeline.py``) calls; with ``trainer.max_staleness >= 1`` that is the producer thread, so extra rounds are
  generated while the trainer trains on the previous batch instead of stalling it. Rewards are computed there too
  (the filter needs them). The loader position saved with a step is the one after its last round, so a resumed run
  draws the prompts after them: no prompt is trained twice; the kept groups beyond the batch are dropped (as
  verl's DAPO recipe does), like the zero-variance ones.
- Equal means exactly equal (``max == min`` of the group's ``score``, the sequence reward before KL), so a group
  dropped is a group whose advantages would be exactly 0.
- The batch keeps its size: if the last round leaves it short, the remaining places are filled with dropped groups
  of the rounds, in generation order, and counted (``train/filled_groups``). They cost compute and contribute no
  policy gradient, as without filtering; training never stops for it.
- Rounds after the first sample with their own seeds (``round_seed``): a resumed run samples the same.
- Group ids (``uid``) of later rounds get a ``#round`` suffix so that a prompt drawn twice in one step (a small
  dataset wrapping around) is two groups, not one.

Metrics: ``train/gen_rounds`` (rounds this step), ``train/kept_group_frac`` (groups with differing scores / groups
generated, over all rounds), ``train/filled_groups``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from verl.protocol import Batch
from verl.trainer import columns

PROMPT_COLUMNS = ("prompts",)  # [B, P], left-padded
FULL_COLUMNS = ("input_ids", "attention_mask", "position_ids")  # [B, P + R]: prompt then response


def round_seed(seed: int, round_index: int) -> int:
    """The sampling seed of round ``round_index`` (0 = the step's own seed, unchanged)."""
    return seed + 1_000_003 * round_index


def constant_groups(uids: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per row: True when every row of its group (same uid) has exactly the same score. ``[B] -> [B]`` bool."""
    uids = np.asarray(uids)
    scores = np.asarray(scores, dtype=np.float64)
    out = np.zeros(len(uids), dtype=bool)
    for uid in dict.fromkeys(uids.tolist()):
        rows = uids == uid
        group = scores[rows]
        out[rows] = group.max() == group.min()
    return out


def group_starts(uids: np.ndarray) -> list[np.ndarray]:
    """Row indices of each group, groups in order of first appearance (rows of a group are consecutive after
    ``Batch.repeat``, but this does not rely on it)."""
    uids = np.asarray(uids)
    return [np.flatnonzero(uids == uid) for uid in dict.fromkeys(uids.tolist())]


def concat_trajectories(batches: list[Batch], pad_id: int) -> Batch:
    """Rows of generated batches with different widths ``P`` and ``R``, re-padded to the widest: prompts left,
    responses right (``pad_id`` in id columns, 0 elsewhere); ``position_ids`` recomputed from the attention mask as
    ``pack_trajectories`` makes them. Columns that are not ``[B, P]``/``[B, P+R]`` and 2-D are ``[B, R]``."""
    if len(batches) == 1:
        return batches[0]
    P = max(b["prompts"].shape[1] for b in batches)
    R = max(b["responses"].shape[1] for b in batches)
    ids = {"prompts", "responses", "input_ids"}

    def pad(x: torch.Tensor, left: int, right: int, name: str) -> torch.Tensor:
        return torch.nn.functional.pad(x, (left, right), value=pad_id if name in ids else 0)

    parts = []
    for b in batches:
        p, r = b["prompts"].shape[1], b["responses"].shape[1]
        tensors = {}
        for name, x in b.tensors.items():
            if x.dim() != 2:
                tensors[name] = x
            elif name in PROMPT_COLUMNS:
                tensors[name] = pad(x, P - p, 0, name)
            elif name in FULL_COLUMNS:
                tensors[name] = torch.cat([pad(x[:, :p], P - p, 0, name), pad(x[:, p:], 0, R - r, name)], dim=1)
            else:
                tensors[name] = pad(x, 0, R - r, name)
        if "position_ids" in tensors:
            tensors["position_ids"] = (tensors["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
        parts.append(Batch(tensors, b.non_tensors, b.meta))
    return Batch.concat(parts)


@dataclass
class FilterResult:
    batch: Batch
    prompts: Batch  # every prompt drawn for the step (to generate again)
    metrics: dict[str, float]


def fill_batch(first: Batch, draw: Callable[[], Batch], generate: Callable[[Batch, int], Batch], groups: int,
               max_rounds: int, pad_id: int) -> FilterResult:
    """Generate (and score) rounds of prompts, keeping the groups whose scores differ, until ``groups`` are kept or
    ``max_rounds`` rounds ran; the batch then has exactly ``groups`` groups (module docstring).

    ``first`` is the step's drawn prompts; ``draw()`` draws the next ``data.train_batch_size`` prompts;
    ``generate(prompts, round)`` returns their generated, scored rows (column ``score``, groups by ``uid``).
    """
    kept: list[Batch] = []
    dropped: list[Batch] = []
    drawn = [first]
    n_kept = n_generated = rounds = 0
    prompts = first
    meta = None
    while True:
        out = columns.require(generate(prompts, rounds), "dynamic_sampling")
        meta = dict(out.meta) if meta is None else meta  # the first round's generation metrics
        if rounds:
            columns.write(out, "dynamic_sampling", uid=np.array([f"{u}#{rounds}" for u in out["uid"]], dtype=object))
        rounds += 1
        constant = constant_groups(out["uid"], out["score"])
        for rows in group_starts(out["uid"]):
            (dropped if constant[rows[0]] else kept).append(out.index(rows))
        n_generated += len(group_starts(out["uid"]))
        n_kept = len(kept)
        if n_kept >= groups or rounds >= max_rounds:
            break
        prompts = draw()
        drawn.append(prompts)
    filled = max(0, groups - n_kept)
    chosen = kept[:groups] + dropped[:filled]
    metrics = {"train/gen_rounds": float(rounds), "train/kept_group_frac": n_kept / max(n_generated, 1),
               "train/filled_groups": float(filled)}
    batch = concat_trajectories(chosen, pad_id)
    batch.meta = meta
    return FilterResult(batch, Batch.concat(drawn), metrics)
