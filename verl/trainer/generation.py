"""The default, single-turn generation function of the trainer (the search agent replaces it).

A generation function maps a batch of prompts (``raw_prompt_ids``) and sampling settings to a
batch of trajectories with the tensors of ``verl.utils.seq.pack_trajectories``. Here every
response token is sampled by the policy, so ``info_mask`` is 1 on every real token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from verl.protocol import Batch
from verl.utils.seq import pack_trajectories
from verl.workers.rollout.base import RolloutEngine, SamplingParams

GenerateFn = Callable[[Batch, SamplingParams], Batch]


class SingleTurnGenerator:
    def __init__(self, engine: RolloutEngine, pad_id: int, max_response_length: int):
        self.engine, self.pad_id, self.max_response_length = engine, pad_id, max_response_length

    def __call__(self, batch: Batch, params: SamplingParams) -> Batch:
        prompt_ids = list(batch["raw_prompt_ids"])
        params.max_tokens = min(params.max_tokens, self.max_response_length)
        outputs = self.engine.generate(prompt_ids, params)
        responses = [o.token_ids for o in outputs]
        tensors = pack_trajectories(prompt_ids, responses, [[1] * len(r) for r in responses], self.pad_id)
        stop = np.array(["answered" if o.finish_reason == "stop" else "max_length" for o in outputs], dtype=object)
        out = Batch(tensors, {**batch.non_tensors, "stop_reason": stop}, dict(batch.meta))
        out.meta["gen_metrics"] = {"agent/mean_response_len": float(tensors["response_mask"].sum(1).float().mean())}
        return out
