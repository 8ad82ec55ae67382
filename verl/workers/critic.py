"""The critic: a value per response token and its clipped value-loss update.

Choices:

* **Model**: ``AutoModelForTokenClassification`` with ``num_labels=1`` loaded from
  ``critic.model.path`` (null = the actor's ``model.path``): the same backbone type as the policy
  with a scalar linear head per position, freshly initialised (seeded by ``trainer.seed``) when
  the checkpoint is a causal LM. Any architecture transformers offers a token-classification
  head for (Qwen2, Llama, Mistral, ...) works without code of our own.
* **Which value**: ``values[:, t]`` is V of the state *before* response token t is emitted, the
  head's output at column P-1+t (the same columns that predict token t in the actor), so GAE
  bootstraps from the state the policy acted in.
* **Loss**: ``value_loss_coef`` x clipped value loss (``core_algos.compute_value_loss``,
  ``cliprange_value`` around the values of the rollout), token-mean over ``loss_mask``, normalised
  by the mini-batch's global token count (``train_utils``). ``critic/vf_loss`` reports the loss
  before the coefficient.
* **On-policy** (one epoch over one mini-batch, a per-row estimator: ``config.computes_values_in_update``, the
  default for GAE): ``update_on_policy`` takes the values from the update's own forward pass (the weights the value
  pass would have used) and computes each micro-batch's returns from them, so the step has no separate value pass;
  the values go back to the trainer, which computes the advantages from them as from ``compute_values``'.
* **Precision**: the passes run under autocast in ``critic.model.fsdp_config.dtype`` over the float32 weights, or,
  with ``critic.compute_weight_copy``, on a copy of the weights in that dtype whose gradients are summed into the
  float32 weights (``weight_copy.py``, as the actor's ``compute_weight_copy``).
* Micro-batches are ``critic.ppo_micro_batch_size_per_gpu`` consecutive rows for both the value pass and the
  update, or, with ``critic.use_dynamic_bsz`` (null: the actor's), rows grouped by length under the token budget
  ``critic.ppo_max_token_len_per_gpu`` (null: the actor's), as the actor's and the reference's passes group them
  (``model_utils.micro_batches``). The loss is normalised by the mini-batch's global counts either way, so the
  grouping changes what each pass computes, not the update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor
from transformers import AutoModelForTokenClassification

from verl.algorithms.core_algos import compute_value_loss, masked_mean
from verl.algorithms.registry import AdvantageInputs
from verl.config import Config, adv_estimator, trajectories_per_step
from verl.protocol import Batch
from verl.workers import weight_copy
from verl.workers.model_utils import (
    DTYPES,
    MicroBatches,
    load_model,
    micro_batches,
    resolve_device,
    response_outputs,
)
from verl.workers.train_utils import (
    GlobalCounts,
    TrainState,
    optimizer_steps_per_training_step,
    token_weight,
)

logger = logging.getLogger(__name__)


class CriticWorker:
    """The value model, one per data-parallel rank."""

    def __init__(self, cfg: Config, total_steps: int):
        self.cfg = cfg
        self.critic_cfg = c = cfg.critic
        model_cfg = cfg.actor_rollout_ref.model
        self.device = resolve_device(cfg.trainer.device)
        self.dtype = DTYPES[c.model.fsdp_config.dtype]  # compute dtype (autocast); the weights stay float32
        self.model = load_model(AutoModelForTokenClassification, c.model.path or model_cfg.path, device=self.device,
                                dtype=torch.float32, seed=cfg.trainer.seed, trainable=True,
                                gradient_checkpointing=c.model.enable_gradient_checkpointing,
                                trust_remote_code=model_cfg.trust_remote_code, offload=c.model.fsdp_config.offload,
                                num_labels=1)
        steps = total_steps * optimizer_steps_per_training_step(trajectories_per_step(cfg), c.ppo_mini_batch_size,
                                                                c.ppo_epochs)
        self.state = TrainState.from_optim(self.model, c.optim, steps, c.grad_clip, host_memory=cfg.trainer.host_memory)
        self.max_tokens = critic_token_budget(cfg)
        # the module the passes run on: the trained one, or its copy in the compute dtype (weight_copy.py)
        self.weight_copy, self.compute_model = weight_copy.attach(self.model, self.dtype, self.state,
                                                                  c.compute_weight_copy)

    def _values(self, micro: Batch) -> Tensor:
        """Values [b, R] at columns P-1 .. P+R-2 (padding columns 0), in the autograd graph if enabled."""
        (values,) = response_outputs(self.compute_model, micro, self.device, self.dtype,
                                     head=lambda out, _: out[..., 0].float())
        return values

    def compute_values(self, batch: Batch) -> Batch:
        """``values`` [B, R] (no grad), 0 where ``loss_mask`` is 0."""
        with torch.no_grad():
            micros = micro_batches(batch, self.critic_cfg.ppo_micro_batch_size_per_gpu, self.max_tokens)
            values = micros.in_batch_order([self._values(micro).cpu() for micro in micros])  # [B, R]
        return Batch({"values": values * batch["loss_mask"]})

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Epochs x mini-batches x micro-batches of the value loss; metrics ``critic/*`` over all ranks.

        Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``loss_mask``,
        ``values`` (from the rollout's ``compute_values``) and ``returns``.
        """
        c = self.critic_cfg
        metrics = self.state.update(batch, c.ppo_mini_batch_size, c.ppo_epochs,
                                    lambda mini: micro_batches(mini, c.ppo_micro_batch_size_per_gpu, self.max_tokens),
                                    self._micro_batch_loss)
        return {f"critic/{name}": value for name, value in metrics.items()}

    def update_on_policy(self, batch: Batch) -> Batch:
        """The on-policy update that measures the values itself (``config.computes_values_in_update``): each
        micro-batch's forward gives ``values`` (detached, 0 where ``loss_mask`` is 0: what ``compute_values`` would
        return, on the same weights), its rows' ``returns`` come from them and ``token_level_rewards`` by the
        estimator (per row: GAE's), then the value loss as ``update_critic``'s. Returns ``values`` [B, R] in batch
        order, with the ``critic/*`` metrics in ``meta["metrics"]``.

        Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``loss_mask`` and
        ``token_level_rewards``.
        """
        c = self.critic_cfg
        estimator = adv_estimator(self.cfg)
        config = {name: getattr(self.cfg.algorithm, name) for name in estimator.config_args}
        made: list[MicroBatches] = []
        measured: list[Tensor] = []

        def split(mini: Batch) -> MicroBatches:
            made.append(micro_batches(mini, c.ppo_micro_batch_size_per_gpu, self.max_tokens))
            return made[-1]

        def targets(micro: Batch, vpreds: Tensor) -> tuple[Tensor, Tensor]:
            mask = micro["loss_mask"].to(self.device).float()  # [b, R]
            values = vpreds.detach() * mask  # [b, R]
            _, returns = estimator.fn(AdvantageInputs(token_level_rewards=micro["token_level_rewards"].to(self.device),
                                                      mask=mask, values=values, config=config))
            measured.append(values.cpu())
            return values, returns

        metrics = self.state.update(batch, c.ppo_mini_batch_size, 1, split,
                                    lambda micro, counts: self._micro_batch_loss(micro, counts, targets))
        if len(made) != 1:
            raise RuntimeError(f"update_on_policy made {len(made)} mini-batches: the on-policy update is one")
        return Batch({"values": made[0].in_batch_order(measured)},
                     meta={"metrics": {f"critic/{name}": value for name, value in metrics.items()}})

    def _micro_batch_loss(self, micro: Batch, counts: GlobalCounts,
                          targets: Callable[[Batch, Tensor], tuple[Tensor, Tensor]] | None = None,
                          ) -> tuple[Tensor, dict[str, float]]:
        """The value loss of a micro-batch; its old values and returns are the batch's columns, or ``targets``'
        (from this forward's values: ``update_on_policy``)."""
        c = self.critic_cfg
        mask = micro["loss_mask"].to(self.device).float()  # [b, R], 1 = a policy token (value is trained)
        vpreds = self._values(micro)  # [b, R]
        if targets is None:
            values_old, returns = micro["values"].to(self.device), micro["returns"].to(self.device)
        else:
            values_old, returns = targets(micro, vpreds)
        vf_loss, clipfrac = compute_value_loss(vpreds, values_old, returns, mask, c.cliprange_value, "token-mean",
                                               counts.tokens, counts.seqs)
        share = token_weight(mask, counts)
        metrics = {"vf_loss": vf_loss.item(), "vf_clipfrac": clipfrac.item() * share,
                   "vpred_mean": masked_mean(vpreds.detach(), mask).item() * share}
        return c.value_loss_coef * vf_loss, metrics

    def save_checkpoint(self, path: str) -> None:
        """Model, optimiser and scheduler under ``path`` (call on every rank)."""
        self.state.save(path)

    def load_checkpoint(self, path: str) -> None:
        """Restore ``save_checkpoint``'s state (call on every rank)."""
        self.state.load(path)


def critic_token_budget(cfg: Config) -> int | None:
    """The critic's micro-batch token budget (``critic.use_dynamic_bsz`` and ``critic.ppo_max_token_len_per_gpu``,
    each the actor's where null), or None: micro-batches of ``critic.ppo_micro_batch_size_per_gpu`` rows."""
    c, actor = cfg.critic, cfg.actor_rollout_ref.actor
    dynamic = actor.use_dynamic_bsz if c.use_dynamic_bsz is None else c.use_dynamic_bsz
    if not dynamic:
        return None
    return actor.ppo_max_token_len_per_gpu if c.ppo_max_token_len_per_gpu is None else c.ppo_max_token_len_per_gpu
