"""Packing ragged token-id lists into the padded tensors every worker consumes.

Layout of one row (P = longest prompt of the batch, R = longest response):

    input_ids      = [pad .. pad, prompt ids] + [response ids, pad .. pad]    # [B, P + R]
                      <- left-padded to P ->    <- right-padded to R ->

The response starts at column P for every row, so log-probs of the response are read from the
logits at columns P-1 .. P+R-2. ``position_ids`` count only real tokens, so left padding does not
shift positions.
"""

from __future__ import annotations

import torch


def pack_trajectories(prompt_ids: list[list[int]], response_ids: list[list[int]], info_masks: list[list[int]],
                      pad_id: int, rollout_log_probs: list[list[float]] | None = None) -> dict[str, torch.Tensor]:
    """Pad prompts (left) and responses (right) into tensors.

    Args:
        prompt_ids: per row, the prompt token ids (chat template applied).
        response_ids: per row, the response token ids (sampled + inserted, in order).
        info_masks: per row, one int per response token: 1 = sampled by the policy (trained),
            0 = inserted by the environment (context only).
        pad_id: id written into padding positions.
        rollout_log_probs: per row, one float per response token: the engine's log-prob of a sampled
            token (0.0 on inserted ones); None = not packed.

    Returns tensors ``prompts`` [B, P], ``responses`` [B, R], ``input_ids`` [B, P+R],
    ``attention_mask`` [B, P+R], ``position_ids`` [B, P+R], ``response_mask`` [B, R] (1 = real
    response token, 0 = padding), ``info_mask`` [B, R] (0 on padding as well) and, when given,
    ``rollout_log_probs`` [B, R] float32 (0 on padding).
    """
    if not (len(prompt_ids) == len(response_ids) == len(info_masks)):
        raise ValueError("prompt_ids, response_ids and info_masks must have one entry per row")
    for i, (r, m) in enumerate(zip(response_ids, info_masks)):
        if len(r) != len(m):
            raise ValueError(f"row {i}: {len(r)} response tokens but {len(m)} info_mask entries")
    rows = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    R = max(1, max(len(r) for r in response_ids))
    prompts = torch.full((rows, P), pad_id, dtype=torch.long)
    prompt_attn = torch.zeros((rows, P), dtype=torch.long)
    responses = torch.full((rows, R), pad_id, dtype=torch.long)
    response_mask = torch.zeros((rows, R), dtype=torch.long)
    info_mask = torch.zeros((rows, R), dtype=torch.long)
    for i, (p, r, m) in enumerate(zip(prompt_ids, response_ids, info_masks)):
        if p:
            prompts[i, P - len(p):] = torch.tensor(p)
            prompt_attn[i, P - len(p):] = 1
        if r:
            responses[i, :len(r)] = torch.tensor(r)
            response_mask[i, :len(r)] = 1
            info_mask[i, :len(r)] = torch.tensor(m)
    attention_mask = torch.cat([prompt_attn, response_mask], dim=1)  # [B, P+R]
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # [B, P+R]
    packed = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "info_mask": info_mask,
    }
    if rollout_log_probs is not None:
        packed["rollout_log_probs"] = torch.zeros((rows, R), dtype=torch.float32)
        for i, lps in enumerate(rollout_log_probs):
            if len(lps) != len(response_ids[i]):
                raise ValueError(f"row {i}: {len(response_ids[i])} response tokens but {len(lps)} rollout log-probs")
            packed["rollout_log_probs"][i, :len(lps)] = torch.tensor(lps, dtype=torch.float32)
    return packed
