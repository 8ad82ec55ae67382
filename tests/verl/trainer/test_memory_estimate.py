"""The start-up memory estimate is made at the lengths the data and the retriever produce, with the bound second.

Guards against issue 57's item 4: the start-up estimate was a bound at the configured maximum lengths ("about 62.5
GiB expected per host" for a 135M policy whose peak was 9.4 GiB under Search-R1's lengths), which scared users off.
The policy has the demo-real model's width (SmolLM2-135M-Instruct's published config: hidden 576, 49,152 tokens; 6
of its 30 layers, to keep the test short) with random weights, whose rows run every turn to its budget: the step's
longest row is then the one the estimate expects, and its measured peak is what the estimate must come within 30 %
of. The prompt lengths are Search-R1's (data.max_prompt_length=4096, data.max_start_length=2048), far above the
data's prompts, so the bound is far above the peak. Two steps: the first step's peak lacks the optimiser's moments,
made at its end.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from retrieval_server.launcher import ServerProcess
from tests.search_workspace import build_search_workspace
from tests.verl.trainer.trainer_test_utils import metrics

pytestmark = pytest.mark.slow  # trains a 135M model for a step

# SmolLM2-135M-Instruct's config.json (what `make demo-real` imports), less its token ids (the test's tokenizer's)
# and with 6 of its 30 layers
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)
SUMMARY = re.compile(r"memory   about ([\d.]+) GiB per device at the data's lengths \(rows up to (\d+) tokens\); "
                     r"([\d.]+) GiB at the configured maximum lengths")


def demo_real_shape(ws: Path, out: Path) -> Path:
    """A random-weight model of SmolLM2-135M's width with the workspace's tokenizer (ids past its vocabulary decode
    to nothing: the policy never writes an action, so every turn runs to its budget)."""
    shutil.copytree(ws / "model", out, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    tiny = LlamaConfig.from_pretrained(ws / "model")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M, bos_token_id=tiny.bos_token_id,
                                         eos_token_id=tiny.eos_token_id, pad_token_id=tiny.pad_token_id))
    model.save_pretrained(out)
    return out


def test_the_start_up_estimate_at_the_data_lengths_is_within_30_percent_of_the_peak(tmp_path, run_main):
    (tmp_path / "ws").mkdir()
    ws = build_search_workspace(tmp_path / "ws")
    model = demo_real_shape(ws, tmp_path / "policy")
    out = tmp_path / "run"
    with ServerProcess(ws / "index", ws / "corpus.jsonl") as server:
        server.wait_ready()
        # the demo-real GRPO's micro-batches and dtypes, Search-R1's prompt lengths, shorter turns (a CPU step)
        proc = run_main([
            f"data.train_files={ws / 'data' / 'train.parquet'}", f"data.val_files={ws / 'data' / 'test.parquet'}",
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf", f"retriever.url={server.url}",
            "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.n=2",
            "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
            "data.max_prompt_length=4096", "data.max_start_length=2048", "data.max_response_length=128",
            "data.max_trajectory_length=256", "data.max_obs_length=256", "trainer.total_training_steps=2",
            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out}", "trainer.device=cpu"])
        output, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, output[-3000:]
    (found,) = SUMMARY.findall(output)
    expected, row_tokens, bound = float(found[0]), int(found[1]), float(found[2])
    # the run's peak: from step 2 on, AdamW's moments (made at step 1's optimiser step) live beside the activations
    peak = max(step["perf/step_max_rss_gb"] for step in metrics(out))
    for step in (1, 2):
        rows = [json.loads(line) for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert max(r["response_length"] for r in rows) == 256  # the rows reached the response length estimated
    print(f"start-up estimate at the data's lengths {expected:.2f} GiB (rows up to {row_tokens} tokens), bound "
          f"{bound:.2f} GiB, the run's peak RSS {peak:.2f} GiB")  # the figures (pytest -s shows them)
    assert abs(expected - peak) <= 0.3 * peak, (expected, peak, output[-2000:])
    assert bound > 1.3 * peak, (bound, peak)  # the bound alone would have overstated it
    assert row_tokens < 2048 + 256  # the data's prompts, not data.max_start_length
