"""A step's learning signal, from its generated batch to its advantages: four phases of the column table
(``verl.trainer.columns``), run in this order by ``PPOTrainer.run_step`` and written here.

**1. The reward** (``RewardManager.score_batch``): rule rewards on decoded responses -> token-level scores. A score
function has the verl/Search-R1 signature ``fn(data_source: str, solution_str: str, ground_truth, extra_info) ->
float`` and sees only the RESPONSE text (never the prompt). The score is placed on the response's last
policy-sampled token (last position with ``loss_mask == 1``): that is the action that ended the trajectory, and
with state masking no reward may sit on an inserted token, where no gradient or value target exists.

**2. Overlong trajectories** (``apply_overlong``), by ``algorithm.overlong.mode``: the rows the length budget cut
(DAPO, Yu et al. 2025: "Overlong Filtering" and "Soft Overlong Punishment"). A row is *cut* when the recipe's
generation says so, in the per-row ``truncated`` column of the generation contract (the generate phase of
``verl.trainer.columns.STEP``; the search recipe, for example, sets it when a length budget ended the trajectory,
``data.max_trajectory_length`` most often; docs/design.md, "Lengths"). Where such a row stops is where
the budget stopped it, not where the policy chose to, so training on its outcome as if the policy had ended there
teaches the wrong lesson. The trainer step applies the mode right after the reward, before log-probs, values and
advantages (``PPOTrainer.run_step``), so every later phase sees its effect.

* ``none``: cut rows are trained as any other (Search-R1's behaviour).
* ``mask`` (DAPO's overlong filtering; SkyRL's ``apply_overlong_filtering``): the ``loss_mask`` of a cut row is
  zeroed, so it is in no policy loss, entropy or KL term, no value loss, no advantage whitening and no token
  metric. Its score still counts in its group's baseline (GRPO, RLOO): the baseline estimates the expected score
  of the prompt's samples, cut ones included; only the row's own gradient is removed.
* ``soft_penalty`` (DAPO's soft overlong punishment; verl's ``reward_model.overlong_buffer``): with
  L_max = ``data.max_trajectory_length`` and L_cache = ``buffer_len``, a row of |y| response tokens (sampled and
  inserted: the unit of the budget) gets ``penalty_factor * clip(((L_max - L_cache) - |y|) / L_cache, -1, 0)``:
  0 up to L_max - L_cache, then falling linearly to ``-penalty_factor`` at L_max (and beyond). Every row gets it by
  its length, cut or not, as in DAPO; it is added to the outcome score on the token that holds it (the last
  ``loss_mask`` token, ``last_token_index``), in ``token_level_scores``; the per-row ``score`` (the task's,
  e.g. exact match) is left as it was.

Logged every step: ``train/overlong_frac`` (share of the rows that were cut), ``train/overlong_masked`` (number of
rows whose loss mask was zeroed: the cut rows under ``mask``, else 0) and, under ``soft_penalty``,
``train/overlong_penalty`` (mean penalty per row).

**3. The rewards per token** (``token_rewards``): ``token_level_rewards`` [B, R], the scores with KL-in-reward
(``algorithm.use_kl_in_reward``) and the turn rewards (``algorithm.turn_reward_coef``).

**4. The advantages** (``compute_advantages``), after the critic's values: ``advantages``, ``returns`` [B, R] by
the estimator registered under ``algorithm.adv_estimator`` (``verl.algorithms.registry``), over ``loss_mask`` and
given what its registration declares it reads. The rewards come before the values because an on-policy critic
computes its targets from them inside its update (``CriticWorker.update_on_policy``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from verl.algorithms import core_algos, turn_credit
from verl.config import Config, OverlongConfig, adv_estimator, declared
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


# ------------------------------------------------------------------ overlong trajectories
def soft_overlong_penalty(lengths: Tensor, max_length: int, buffer_len: int, penalty_factor: float) -> Tensor:
    """DAPO's soft overlong punishment of each row: [B] response lengths (tokens) -> [B] penalties in
    [-penalty_factor, 0] (module docstring)."""
    expected = max_length - buffer_len  # longest response that gets no penalty
    return penalty_factor * torch.clamp((expected - lengths.float()) / buffer_len, min=-1.0, max=0.0)


def mask_rows(loss_mask: Tensor, rows: Tensor) -> Tensor:
    """``loss_mask`` [B, R] with every row where ``rows`` [B] (bool) is True set to 0; other rows unchanged."""
    return loss_mask * (~rows).to(loss_mask.dtype)[:, None]


def apply_overlong(batch: Batch, cfg: OverlongConfig, max_trajectory_length: int) -> tuple[Batch, dict[str, float]]:
    """Apply ``cfg.mode`` to a scored batch (``truncated``, ``loss_mask`` [B, R], ``response_mask`` [B, R],
    ``token_level_scores`` [B, R]) -> the batch with ``loss_mask`` or ``token_level_scores`` replaced (in place: the
    overlong phase of ``verl.trainer.columns``), and the step's ``train/overlong_*`` metrics."""
    cut = torch.as_tensor(np.asarray(columns.require(batch, "overlong")["truncated"], dtype=bool))  # [B]
    metrics = {"train/overlong_frac": float(cut.float().mean()) if len(cut) else 0.0, "train/overlong_masked": 0.0}
    if cfg.mode == "mask":
        columns.write(batch, "overlong", loss_mask=mask_rows(batch["loss_mask"], cut))
        metrics["train/overlong_masked"] = float(cut.sum())
    elif cfg.mode == "soft_penalty":
        lengths = batch["response_mask"].sum(dim=-1)  # [B]
        penalty = soft_overlong_penalty(lengths, max_trajectory_length, cfg.buffer_len, cfg.penalty_factor)  # [B]
        scores = batch["token_level_scores"].clone()  # [B, R]
        scores[torch.arange(len(batch)), last_token_index(batch["loss_mask"])] += penalty.to(scores.dtype)
        columns.write(batch, "overlong", token_level_scores=scores)
        metrics["train/overlong_penalty"] = float(penalty.mean())
    elif cfg.mode != "none":
        modes = ", ".join(declared(OverlongConfig, "mode").allowed_choices())
        raise ValueError(f"unknown algorithm.overlong.mode {cfg.mode!r}: valid are {modes}")
    return batch, metrics


# ------------------------------------------------------------------ advantages
def token_rewards(batch: Batch, cfg: Config, kl_ctrl) -> tuple[Batch, dict[str, float]]:
    """``batch`` with the rewards phase's ``token_level_rewards`` [B, R] (written in place): the scores, minus the KL
    penalty (``algorithm.use_kl_in_reward``; ``kl_ctrl``: the adaptive or fixed KL controller,
    ``core_algos.get_kl_controller``), plus the turn rewards (``algorithm.turn_reward_coef``); and the KL metrics."""
    algo, metrics = cfg.algorithm, {}
    mask = columns.require(batch, "rewards")["loss_mask"].float()  # [B, R]
    rewards = batch["token_level_scores"]  # [B, R]
    if algo.use_kl_in_reward:
        rewards, metrics = core_algos.apply_kl_penalty(rewards, batch["old_log_probs"], batch["ref_log_prob"], mask,
                                                       kl_ctrl, algo.kl_penalty)
    if algo.turn_reward_coef:
        policy = batch["response_mask"] * batch["info_mask"]  # [B, R] 1 = sampled by the policy: turns are its runs
        turn_scores = batch["turn_scores"] if "turn_scores" in batch else [[]] * len(batch)  # per row, per turn
        rewards = rewards + algo.turn_reward_coef * turn_credit.place_turn_rewards(turn_scores, policy)
    return columns.write(batch, "rewards", token_level_rewards=rewards), metrics


def compute_advantages(batch: Batch, cfg: Config) -> Batch:
    """``batch`` with the advantages phase's ``advantages`` and ``returns`` [B, R] (written in place): the estimator
    registered under ``algorithm.adv_estimator`` over ``token_level_rewards`` and ``loss_mask``, given what its
    registration declares it reads (the critic's ``values``, the groups' ``uid``, the turns)."""
    mask = columns.require(batch, "advantages")["loss_mask"].float()  # [B, R]
    policy = batch["response_mask"] * batch["info_mask"]  # [B, R] 1 = sampled by the policy: turns are its runs
    turn_scores = batch["turn_scores"] if "turn_scores" in batch else [[]] * len(batch)  # per row, per turn
    estimator = adv_estimator(cfg)
    turns = turn_credit.turn_index(policy) if estimator.needs_turns else None  # [B, R]
    inputs = core_algos.AdvantageInputs(
        token_level_rewards=batch["token_level_rewards"], mask=mask,  # [B, R] each
        values=batch["values"] if estimator.needs_critic else None,  # [B, R]
        index=batch["uid"] if estimator.needs_groups else None,  # [B]
        config={name: getattr(cfg.algorithm, name) for name in estimator.config_args},
        turn_scores=turn_credit.scores_tensor(turn_scores, turns) if turns is not None else None,  # [B, K]
        turn_index=turns)
    advantages, returns = estimator.fn(inputs)
    return columns.write(batch, "advantages", advantages=advantages, returns=returns)
