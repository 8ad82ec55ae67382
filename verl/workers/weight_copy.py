"""A model's weights kept in the compute dtype for its passes (``actor.compute_weight_copy``, the critic's
``critic.compute_weight_copy``).

Under autocast alone (``fsdp_config.dtype: bfloat16``, float32 weights) every micro-batch's forward casts each
weight matrix to bfloat16, its backward casts each weight's gradient back, and the float32 weight of every RMS norm
promotes the norm's output, and with it the residual stream, to float32 (a product of a float32 and a bfloat16 tensor
is float32), so the activations are cast again before each linear layer. A copy of the weights in the compute dtype
removes those casts, and the residual stream stays in that dtype, as it does under FSDP's mixed precision
(``param_dtype: bf16``). On ``make demo-real``'s update (SmolLM2-135M, 24 rows, 2 CPU cores) the update then takes
0.75-0.9x the time (docs/results.md, "Training step speed").

How:

* ``WeightCopy.module`` is a deep copy of the trained module whose parameters (not its buffers: a rotary
  embedding's ``inv_freq`` stays float32) are in the compute dtype. The forward and backward run on it, under the
  same autocast, so softmax and log-softmax still compute in float32.
* Each of its parameters' gradient, once accumulated for a micro-batch (``register_post_accumulate_grad_hook``), is
  added into the float32 parameter's ``.grad`` and freed: gradients sum over micro-batches in float32, as before,
  and clipping, the optimiser step, its skip and undo rules read the float32 gradients and weights unchanged.
* ``refresh()`` copies the float32 weights into it; the training state calls it after every optimiser step and
  checkpoint load (``TrainState.after_weights_change``).

The float32 module stays the one the optimiser, the checkpoints, the weight sync to the rollout engine and the
exported model use. Cost: one more copy of the weights in the compute dtype (half the float32 weights' bytes in
bfloat16). Not for a module sharded with FSDP (its own parameters are the shards) nor under LoRA (the adapters are
the trained weights and the base is frozen): ``verl.config.rl.check_weight_copy`` refuses both.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class WeightCopy:
    """A copy of ``model`` with its parameters in ``dtype`` whose gradients land in ``model``'s float32 ``.grad``."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        # the module deep-copied with its parameters made in ``dtype`` directly (no second float32 copy) and its
        # buffers cloned: through deepcopy's memo, keyed by tensor identity, so tied weights stay one parameter
        memo: dict[int, object] = {id(p): _parameter(p.detach().to(dtype), p.requires_grad) for p in model.parameters()}
        memo.update({id(b): b.detach().clone() for b in model.buffers()})
        self.module = copy.deepcopy(model, memo)  # keeps the train mode and the model's settings
        masters = dict(model.named_parameters())
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []
        for name, param in self.module.named_parameters():
            master = masters[name]
            self.pairs.append((param, master))
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(_into_master(master))

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the trained (float32) weights into the compute copy."""
        for param, master in self.pairs:
            param.copy_(master)


def attach(model: nn.Module, dtype: torch.dtype, state, enabled: bool) -> tuple[WeightCopy | None, nn.Module]:
    """A worker's compute module: ``model`` itself, or (``enabled``) a ``WeightCopy`` of it that ``state`` (its
    ``TrainState``) refreshes after every optimiser step and checkpoint load. Returns (the copy or None, the module
    the passes run on)."""
    if not enabled:
        return None, model
    weights = WeightCopy(model, dtype)
    state.after_weights_change.append(weights.refresh)
    return weights, weights.module


def _parameter(value: torch.Tensor, requires_grad: bool) -> nn.Parameter:
    """A new parameter holding ``value`` (set through ``.data``, as ``nn.Module.to`` does)."""
    param = nn.Parameter(torch.empty(0, dtype=value.dtype), requires_grad=requires_grad)
    param.data = value
    return param


def _into_master(master: nn.Parameter):
    """A hook adding a compute-copy parameter's accumulated gradient into ``master.grad`` (float32), then freeing it."""
    def hook(param: nn.Parameter) -> None:
        grad = param.grad
        if master.grad is None:
            master.grad = grad.to(master.dtype)
        else:
            master.grad.add_(grad)
        param.grad = None
    return hook
