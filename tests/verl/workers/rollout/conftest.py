"""Fixtures of the rollout-engine tests: a tiny real Qwen2 model that has learnt the search-loop format.

The model is built with ``data_prep.tiny_model.save_tiny_model`` (tokenizer trained on a few hundred
templated Search-R1-style traces) and then fine-tuned for 100 small steps on those traces, so its
greedy continuation of "... <search>" is a query then "</search>", and answers end in "</answer>"
then eos: real behaviour to exercise stop strings and eos with, and peaked distributions so greedy
comparisons between engines are not decided by float noise near ties.

Torch runs single-threaded in these tests: the 2-core machine is shared, and two OpenMP threads
spin-waiting against other processes made the fine-tuning ~30x slower than one thread.
"""

from __future__ import annotations

import pytest
import torch

from tests.verl.workers.rollout.rollout_helpers import hf_model, model_dir, prompts, state_dict, tokenizer

__all__ = ["hf_model", "model_dir", "prompts", "state_dict", "tokenizer"]


@pytest.fixture(scope="session", autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
