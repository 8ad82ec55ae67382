"""LoRA adapters on the actor (peft), and the merged weights the rollout engines and exports receive.

Choices:

* **peft** ``get_peft_model`` with a ``LoraConfig`` (rank, alpha, target module names, no dropout:
  log-probs must be a deterministic function of the weights, see ``model_utils``). Adapters start
  as a no-op (B = 0), so the first policy equals the base model.
* **Storage**: base and adapters stay float32 like a fully trained actor. FSDP2 all-gathers one
  dtype per layer group, so a bfloat16 base beside float32 adapters would need a mixed-precision
  policy; full-precision storage keeps the update exact and the code path single.
* **Merged weights out**: engines and exports get the base model's HF names with
  ``W + (alpha / rank) * B @ A`` for every adapted linear layer, computed from gathered tensors
  without touching the actor's own weights (peft's in-place ``merge_adapter`` / ``unmerge_adapter``
  would add float drift to the frozen base at every sync). The rollout engine thus needs no LoRA
  support of its own, at the cost of syncing full weights (as without LoRA).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor, nn

if TYPE_CHECKING:
    from peft import PeftModel

PEFT_PREFIX = "base_model.model."  # peft's prefix of the wrapped model's parameter names
ADAPTER = "default"


@dataclass(frozen=True)
class LoraSpec:
    """The adapters of ``actor_rollout_ref.model`` (lora_rank, lora_alpha, target_modules)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def add_lora(model: nn.Module, spec: LoraSpec) -> PeftModel:
    """``model`` with LoRA adapters on ``spec.target_modules``; only the adapters require gradients. peft is imported
    here, not with the module: every trainer and worker process imports this module, few use LoRA (0.4 s each)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.target_modules),
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def hf_name(name: str) -> str:
    """A peft parameter name -> the base model's name (``base_model.model.`` and ``.base_layer`` dropped)."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def merge_lora(named: Iterator[tuple[str, Tensor]], scaling: float) -> Iterator[tuple[str, Tensor]]:
    """Full tensors under peft names -> the merged model's tensors under HF names, in one pass.

    An adapted layer's base weight is held until its ``lora_A`` and ``lora_B`` arrived (peft lists
    them right after it), then ``W + scaling * B @ A`` is yielded; adapter tensors themselves are
    not. ``scaling`` = lora_alpha / lora_rank.
    """
    held: dict[str, dict[str, Tensor]] = {}  # adapted layer prefix -> {"base" | "A" | "B": tensor}
    for name, tensor in named:
        if name.endswith(".base_layer.weight"):
            part, layer = "base", name.removesuffix(".base_layer.weight")
        elif name.endswith(f".lora_A.{ADAPTER}.weight"):
            part, layer = "A", name.removesuffix(f".lora_A.{ADAPTER}.weight")
        elif name.endswith(f".lora_B.{ADAPTER}.weight"):
            part, layer = "B", name.removesuffix(f".lora_B.{ADAPTER}.weight")
        else:
            yield hf_name(name), tensor
            continue
        parts = held.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == 3:
            del held[layer]
            delta = (parts["B"].float() @ parts["A"].float()) * scaling  # [out, r] @ [r, in] -> [out, in]
            yield hf_name(f"{layer}.weight"), (parts["base"].float() + delta).to(parts["base"].dtype)
    if held:
        raise ValueError(f"adapted layers without base weight or both adapters: {sorted(held)[:3]}")
