"""Rule rewards on decoded responses -> token-level scores.

A score function has the verl/Search-R1 signature
``fn(data_source: str, solution_str: str, ground_truth, extra_info) -> float`` and sees only the
RESPONSE text (never the prompt). The score is placed on the response's last policy-sampled token
(last position with ``loss_mask == 1``): that is the action that ended the trajectory, and with
state masking no reward may sit on an inserted token, where no gradient or value target exists.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from verl.protocol import Batch
from verl.trainer import columns

ScoreFn = Callable[..., float]


def load_custom_score_fn(path: str, name: str) -> ScoreFn:
    """Load ``name`` from the Python file ``path`` (custom_reward_function.path / .name)."""
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"custom_reward_function.path={path!r} does not exist")
    spec = importlib.util.spec_from_file_location("custom_reward_module", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise AttributeError(f"custom_reward_function.name={name!r} is not defined in {path}")
    return getattr(module, name)


def decode_responses(batch: Batch, tokenizer) -> list[str]:
    """Response text of each row (real tokens only; chat special tokens dropped, tags kept)."""
    texts = []
    for ids, mask in zip(batch["responses"], batch["response_mask"]):
        texts.append(tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True))
    return texts


def last_token_index(loss_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the last position with mask 1 (0 for an all-zero row). [B, R] -> [B]"""
    positions = torch.arange(loss_mask.shape[1], device=loss_mask.device).expand_as(loss_mask)
    return torch.where(loss_mask.bool(), positions, torch.zeros_like(positions)).max(dim=1).values


class RewardManager:
    """Scores a generated batch: ``token_level_scores`` [B, R], the per-row scores, the texts and the details.

    ``details_fn`` (a recipe's ``reward_details``) may replace the scores (unless ``score_fn`` is a user's
    custom_reward_function, which always decides the score) and adds logged per-row terms and per-turn scores.
    """

    def __init__(self, tokenizer, score_fn: ScoreFn, details_fn=None, custom: bool = False):
        self.tokenizer = tokenizer
        self.score_fn = score_fn
        self.details_fn = details_fn
        self.custom = custom

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, np.ndarray, list[str], object]:
        texts = decode_responses(batch, self.tokenizer)
        details = self.details_fn(batch, texts, self.tokenizer) if self.details_fn is not None else None
        if details is not None and details.scores is not None and not self.custom:
            scores = np.asarray(details.scores, dtype=np.float32)
        else:
            scores = np.array([
                float(self.score_fn(ds, text, gt, extra)) for ds, text, gt, extra in
                zip(batch["data_source"], texts, batch["ground_truth"], batch["extra_info"])], dtype=np.float32)
        loss_mask = batch["loss_mask"]
        token_scores = torch.zeros(loss_mask.shape, dtype=torch.float32)  # [B, R]
        token_scores[torch.arange(len(scores)), last_token_index(loss_mask)] = torch.from_numpy(scores)
        return token_scores, scores, texts, details

    def score_batch(self, batch: Batch) -> Batch:
        """``batch`` with its reward columns: ``token_level_scores`` [B, R] (the score on the last policy token),
        ``score`` [B], ``response_text`` [B] and, from the details, ``reward/<term>`` [B] (logged as their mean) and
        ``turn_scores`` (per row, a list per policy turn; ``verl.algorithms.turn_credit``): the reward phase of the
        column table (``verl.trainer.columns``), written in place."""
        token_scores, scores, texts, details = self(columns.require(batch, "reward"))
        new = {"token_level_scores": token_scores, "score": scores, "response_text": np.array(texts, dtype=object)}
        if details is not None:
            new.update({name: np.asarray(values, dtype=np.float64) for name, values in details.row_terms.items()})
            if details.turn_scores is not None:
                new["turn_scores"] = [list(row) for row in details.turn_scores]
        return columns.write(batch, "reward", **new)
