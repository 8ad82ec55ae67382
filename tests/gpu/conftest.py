"""The GPU tier (``make test-gpu``; ``benchmarks/gpu_tests.sh`` carries and runs it on a machine without package
registries): the trainer's GPU path end to end, on the CPU tests' own fixtures.

Every test here is marked ``gpu``: skipped where no CUDA device exists (``tests/conftest.py``), run on the CPU as a
trial of the tier with ``GPU_TESTS_DEVICE=cpu`` (``gpu_helpers.DEVICE`` is where they run). The fixtures are the CPU
tests': the fine-tuned tiny rollout policy (``tests/verl/workers/rollout/rollout_helpers.py``), the worker tests' tiny
model (``tests/verl/workers/worker_test_utils.py``), and the search tests' BM25 service on loopback with the tiny
policy that memorised a search-then-answer trajectory through it (``tests/search_r1/conftest.py``).

Only what the GPU machine has may be imported at module level here: torch, transformers, the project, and the
carried wheels (no vLLM, Ray or FAISS; ``tests/gpu/test_gpu_vllm.py`` skips without vLLM).
"""

from __future__ import annotations

from tests.search_r1.conftest import corpus_texts, policy, retrieval_index, service_url
from tests.verl.workers.rollout.rollout_helpers import hf_model, model_dir, prompts, state_dict, tokenizer
from tests.verl.workers.worker_test_utils import tiny_model_dir

__all__ = ["corpus_texts", "hf_model", "model_dir", "policy", "prompts", "retrieval_index", "service_url",
           "state_dict", "tiny_model_dir", "tokenizer"]
