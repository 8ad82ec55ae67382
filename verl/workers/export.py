"""Writing a trained policy as a Hugging Face model directory (``hf_model/``), shared by the RL actor and the SFT
trainer.

Choices: the weights are gathered from every rank (a collective) and written by rank 0 only, into a model built
on the meta device from the source model's config (no second float32 copy is allocated); under LoRA the adapted
layers are merged (``lora.merge_lora``) under the base model's names, so any loader (transformers, vLLM, the next
trainer) reads it as a plain model. The source's generation config and tokenizer are copied beside it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from verl.workers.distributed import gather_full_state_dict, world
from verl.workers.lora import LoraSpec, merge_lora

logger = logging.getLogger(__name__)


def save_hf_model(model: nn.Module, lora: LoraSpec | None, source: str, trust_remote_code: bool, out: str) -> None:
    """Write ``model`` (trained from the directory ``source``) to ``out`` as a Hugging Face model directory: weights
    (merged under LoRA), config, generation config and tokenizer. Call on every rank: gathering is a collective."""
    state = gather_full_state_dict(model)
    if world()[0] != 0:
        return
    named = iter(state.items())
    state = dict(named if lora is None else merge_lora(named, lora.scaling))
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    hf_model.load_state_dict(state, assign=True)
    hf_model.tie_weights()
    if (Path(source) / "generation_config.json").exists():
        hf_model.generation_config = GenerationConfig.from_pretrained(source)
    final, tmp = Path(out), Path(f"{out}.tmp")  # written whole, then renamed: a kill leaves no half model directory
    shutil.rmtree(tmp, ignore_errors=True)
    hf_model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code).save_pretrained(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    logger.info("saved the trained policy to %s", out)
