"""AdamW that stores its two moment estimates in a lower precision (bfloat16) and updates in float32.

``torch.optim.AdamW`` keeps both moments in the parameters' dtype: 8 bytes per float32 parameter,
half of a full fine-tune's training memory (weights 4 + gradients 4 + moments 8). Storing the
moments in bfloat16 takes 4 bytes instead. Each step upcasts a parameter's moments, applies the
AdamW update (Loshchilov & Hutter 2019; decoupled weight decay, bias correction, no amsgrad: the
arithmetic of torch's AdamW) in float32 and rounds the moments back to their storage dtype. With
float32 storage the trainer uses torch's AdamW itself (``train_utils.TrainState``); this class is
only the ``optim_state_dtype: bfloat16`` path. Works on plain tensors and FSDP2 shards (DTensors).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


class LowPrecisionStateAdamW(torch.optim.Optimizer):
    """AdamW with moments stored in ``state_dtype`` (see the module docstring)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, state_dtype: torch.dtype = torch.bfloat16):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.state_dtype = state_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param, dtype=self.state_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=self.state_dtype)
                state["step"] += 1
                step = float(state["step"])
                grad = param.grad.float()
                exp_avg = state["exp_avg"].float().lerp_(grad, 1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                param.mul_(1 - lr * weight_decay)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1 ** step))
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
        return loss
