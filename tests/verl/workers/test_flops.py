"""Model FLOPs for perf/mfu/*: the count of verl.workers.flops against torch's own FLOP counter."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from verl.workers.flops import ModelFlops, measure_peak_flops

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = {
    "llama-tied-gqa": LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True),
    "qwen2-untied-head-dim": Qwen2Config(hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=257,
                                         tie_word_embeddings=False),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_flops_match_torchs_count_of_the_eager_forward(family):
    """Guards against a wrong weight count (an untied head, grouped KV heads, a head_dim that is not hidden / heads)
    or a wrong attention term: torch's counter over the eager forward (which computes the full T x T scores) equals
    2 W T + 4 L A T^2 per row; ours counts the causal half of the scores, T (T + 1) / 2."""
    config = FAMILIES[family]
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config)
    flops = ModelFlops.of(model)
    rows, length = 3, 12
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, config.vocab_size, (rows, length)))
    full_scores = 4 * flops.layers * flops.attention_width * length * length * rows
    assert counter.get_total_flops() == 2 * flops.linear_weights * length * rows + full_scores
    causal = flops.forward(torch.full((rows,), length))
    assert causal == counter.get_total_flops() - full_scores + full_scores * (length + 1) / (2 * length)
    assert flops.forward(torch.tensor([5, 7])) == flops.forward(torch.tensor([5])) + flops.forward(torch.tensor([7]))


def test_measured_peak_is_a_plausible_rate():
    """A rate, not a time: between 1 GFLOP/s and 10 PFLOP/s on any device this runs on."""
    assert 1e9 < measure_peak_flops("cpu", "float32", size=256) < 1e16
