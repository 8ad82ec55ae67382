"""The memory estimate's activation term against what autograd really keeps in a decoder layer."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from verl.workers.memory import activation_bytes


def saved_bytes_per_token_layer(config, dtype: torch.dtype, tokens: int = 256, rows: int = 2) -> float:
    """Bytes of the distinct storages autograd saves in a forward, per token and decoder layer (weights excluded;
    2 and 4 layers, so the embedding and the final norm cancel)."""
    totals = []
    for layers in (2, 4):
        config.num_hidden_layers = layers
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor, weights=weights, saved=saved) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
            return t

        ids = torch.randint(0, config.vocab_size, (rows, tokens))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", torch.bfloat16, enabled=dtype == torch.bfloat16):
            model.model(input_ids=ids)  # the actor's path: autocast over float32 weights for 2-byte compute
        totals.append(sum(saved.values()))
    return (totals[1] - totals[0]) / 2 / tokens / rows


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_activation_term_matches_what_autograd_keeps(family, dtype):
    """Guards against an activation term that drifts from the models' real layers (the 34 h of GPT-style layers
    was 40-60 % under these): within 20 % for two families, two MLP widths and both compute widths."""
    shape = {"llama": LlamaConfig(hidden_size=256, intermediate_size=688, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=512),
             "qwen2": Qwen2Config(hidden_size=256, intermediate_size=1376, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=512)}[family]
    measured = saved_bytes_per_token_layer(shape, dtype)
    estimated = activation_bytes(shape.hidden_size, shape.intermediate_size, dtype.itemsize)
    assert 0.8 < estimated / measured < 1.2, (measured, estimated)
