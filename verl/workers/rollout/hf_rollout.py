"""Rollout engine on a transformers model: token ids in, sampled token ids (+ log-probs) out.

The reference engine and the default (the faster one for the tiny demo policy on CPU; also the one used where vLLM is
not installed, e.g. the GPU machine). It behaves like ``VLLMRollout`` so the two are interchangeable:
- Prompts are left-padded into micro-batches of ``micro_batch_size`` rows (after expanding each
  prompt ``n`` times, so samples stay grouped by prompt), run once through the model (the prompt pass, keeping the
  KV cache), then decoded one token a step (``verl/workers/rollout/hf_decode.py``). Position ids come from the
  attention mask, as ``model.generate`` derives them, so padding does not shift positions.
- Two KV caches (``kv_cache``; auto = static on a GPU, dynamic elsewhere). Dynamic: rows leave the batch as they
  end: once a quarter or more of the rows still in the batch have ended (eos, a stop string), those rows are
  dropped from the batch and from the KV cache, so a row that runs to ``max_tokens`` while the others stopped early
  decodes alone (about 3x cheaper a token than a batch of 24 for SmolLM2-135M on a CPU); ``model.generate`` keeps
  every row to the end. Static: a pre-sized cache whose decode step reads and writes fixed buffers, captured once
  as a CUDA graph and replayed (``cuda_graphs``): on a GPU a decode step of an eager transformers model is hundreds
  of kernel launches, which the graph replaces by one.
- Devices: the logits, sampled ids, log-probs and batch indices stay on the model's device; one host copy a step (the
  sampled ids, for the stop check) and one a call (the log-probs).
- Sampling comes only from ``SamplingParams`` (``hf_decode.Sampler``), never from the checkpoint's
  ``generation_config`` (repetition penalty, top-k, ... cannot leak in), as with vLLM given explicit sampling params.
  temperature 0 = greedy; top_k -1 and top_p 1 = off. Eos ids are the tokenizer's eos plus the checkpoint's
  ``eos_token_id``(s), as vLLM.
- Stop strings follow vLLM: generation of a row ends at the first token whose detokenised output
  (special tokens skipped, prompt excluded) contains a stop string; that token is kept and
  everything after it dropped, so ``token_ids`` are exactly the sampled ids up to the stop string /
  eos; ``finish_reason`` is "stop" (eos or stop string, ``stop_str`` names the string) or "length".
  A token is checked by id unless its text can complete a stop string; then only a short window of the row's newest
  tokens is decoded (``hf_decode.StopCheck``); the exact cut is made afterwards on the full text
  (``truncate_at_stop``).
- Log-probs are the model's raw log-softmax (no temperature, top-k or top-p applied) of each
  sampled token, the same quantity as vLLM's default ``raw_logprobs``; memory stays O(batch x vocab): the prompt
  pass computes the logits of the last position only.
- Seeds: a call with ``seed`` runs under that torch seed (inside ``fork_rng``, so the global RNG is
  untouched); a call without draws its seed from the engine's generator seeded once by ``seed``.
  A call with ``row_seeds`` samples each row with its own ``torch.Generator`` (on the model's device), so a row's
  tokens do not depend on the other rows of the call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from verl.workers.model_utils import DTYPES
from verl.workers.rollout.base import GenerationOutput, SamplingParams
from verl.workers.rollout.hf_decode import (
    LENGTH_QUANTUM,
    DynamicKV,
    Sampler,
    StaticKV,
    StopCheck,
    static_kv_supported,
    stop_candidates,
)

logger = logging.getLogger(__name__)


class HFRollout:
    """``RolloutEngine`` on a transformers model, with its own decode loop (see the module docstring)."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu", micro_batch_size: int = 64,
                 seed: int = 0, kv_cache: str = "auto", cuda_graphs: bool = True, free_cache: bool = False) -> None:
        self.device = torch.device(device)
        self.micro_batch_size = micro_batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype]).to(self.device)
        self.model.eval()
        checkpoint_eos = self.model.generation_config.eos_token_id  # None | int | list[int]
        checkpoint_eos = [checkpoint_eos] if isinstance(checkpoint_eos, int) else list(checkpoint_eos or [])
        tokenizer_eos = [] if self.tokenizer.eos_token_id is None else [self.tokenizer.eos_token_id]
        self.eos_ids = sorted(set(checkpoint_eos + tokenizer_eos))
        if not self.eos_ids:
            raise ValueError(f"{model_path}: neither the tokenizer nor generation_config defines an eos token")
        pad = self.tokenizer.pad_token_id
        self.pad_id = self.eos_ids[0] if pad is None else pad
        self.model.generation_config = GenerationConfig(eos_token_id=self.eos_ids, pad_token_id=self.pad_id)
        self.rng = torch.Generator().manual_seed(seed)
        self._threads = torch.get_num_threads()  # OpenMP's thread count is per thread: callers' threads get this one
        if kv_cache not in ("auto", "dynamic", "static"):
            raise ValueError(f"kv_cache={kv_cache!r}: allowed auto | dynamic | static")
        static = kv_cache == "static" or (kv_cache == "auto" and self.device.type == "cuda")
        self.static = static and static_kv_supported(self.model)
        self.cuda_graphs = cuda_graphs and self.static and self.device.type == "cuda"
        self._static_kv: StaticKV | None = None  # the last shape's cache (and graph), reused while calls fit it
        self.free_cache = free_cache  # drop it after each call (its memory goes back to training)
        self._stop_candidates: dict[tuple[str, ...], frozenset[int] | None] = {}

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Continue each prompt; ``len(prompts) * params.n`` outputs grouped by prompt."""
        if torch.get_num_threads() != self._threads:  # called from a pool thread (async loop, threaded Ray actor)
            torch.set_num_threads(self._threads)
        rows = [list(ids) for ids in prompts for _ in range(params.n)]
        seeds = None if params.row_seeds is None else [s + j for s in params.row_seeds for j in range(params.n)]
        if seeds is not None and len(params.row_seeds) != len(prompts):
            raise ValueError(f"{len(params.row_seeds)} row_seeds for {len(prompts)} prompts")
        call_seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self.rng))
        devices = []  # CUDA devices whose RNG state fork_rng saves and restores
        if self.device.type == "cuda":
            devices = [torch.cuda.current_device() if self.device.index is None else self.device.index]
        stops = tuple(params.stop)
        if stops not in self._stop_candidates:
            self._stop_candidates[stops] = stop_candidates(self.tokenizer, list(stops)) if stops else frozenset()
        stop = StopCheck(self.eos_ids, list(stops), self._stop_candidates[stops], self._decode)
        outputs: list[GenerationOutput] = []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(call_seed)
            for start in range(0, len(rows), self.micro_batch_size):
                stop_at = start + self.micro_batch_size
                outputs.extend(self._generate_micro_batch(rows[start:stop_at], params, stop,
                                                          None if seeds is None else seeds[start:stop_at]))
        if self.free_cache:
            self._static_kv = None
        return outputs

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the actor's tensors (HF names, any subset) into the model in place, one at a time (the
        iterator is not materialised; a tied weight updates both of its names). In place, so a captured CUDA graph
        reads the new weights."""
        own = self.model.state_dict()  # tensors sharing storage with the parameters
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in own:
                    raise KeyError(f"sync_weights got a name the model does not have: {name!r}")
                own[name].copy_(tensor)

    def _kv(self, rows: int, length: int) -> DynamicKV | StaticKV:
        """The cache for ``rows`` rows of up to ``length`` tokens: dynamic, or the static one of that shape (the batch
        padded to a power of two, the length rounded up to ``LENGTH_QUANTUM``; one shape kept at a time)."""
        if not self.static:
            return DynamicKV(self.model)
        width = min(1 << (rows - 1).bit_length(), max(self.micro_batch_size, rows))
        length = -(-length // LENGTH_QUANTUM) * LENGTH_QUANTUM
        if self._static_kv is None or not self._static_kv.fits(width, length):
            if self._static_kv is not None and self._static_kv.graph is not None and self._static_kv.graph.failed:
                self.cuda_graphs = False  # said once (CudaGraphStep's warning): later shapes decode eagerly too
            self._static_kv = None  # free the previous shape's cache first
            self._static_kv = StaticKV(self.model, width, length, self.pad_id, self.device, self.cuda_graphs)
        return self._static_kv

    def _generate_micro_batch(self, rows: list[list[int]], params: SamplingParams, stop: StopCheck,
                              seeds: list[int] | None) -> list[GenerationOutput]:
        """One left-padded batch through the decode loop (the module docstring).

        One host sync a token: the chosen ids (``chosen.tolist()``), which the stop check reads; the log-probs stay
        on the device, in a [B, max_tokens] buffer (row i's token t at [i, t]), until the call ends."""
        input_ids, attention_mask = self._left_pad(rows)  # [B, P]
        kv = self._kv(len(rows), input_ids.shape[1] + params.max_tokens)
        logits = kv.prefill(input_ids, attention_mask)  # [b, V]: the next-token logits of the rows still in the batch
        draw = Sampler(params, seeds, len(rows), self.device)
        new_ids: list[list[int]] = [[] for _ in rows]
        logprobs = torch.zeros((len(rows), params.max_tokens), device=self.device) if params.logprobs else None
        batch = list(range(len(rows)))  # the call's row at each batch position
        batch_index = torch.arange(len(rows), device=self.device)  # [b]: the same, on the device
        ended = [False] * len(rows)  # ended rows not yet removed from the batch
        for step in range(params.max_tokens):
            chosen = draw(logits, batch, batch_index)  # [b], on the device
            if logprobs is not None:
                logprobs[batch_index, step] = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])[:, 0]
            for j, (row, token) in enumerate(zip(batch, chosen.tolist(), strict=True)):  # the step's one host sync
                if not ended[j]:
                    new_ids[row].append(token)
                    ended[j] = stop.ends(new_ids[row])
            if all(ended) or step + 1 == params.max_tokens:
                break
            if kv.can_drop and 4 * sum(ended) >= len(batch):  # a quarter or more of the batch has ended: drop them
                keep = [j for j, done in enumerate(ended) if not done]
                keep_index = torch.tensor(keep, device=self.device)  # [b']
                kv.keep(keep_index)
                batch, batch_index, chosen = [batch[j] for j in keep], batch_index[keep_index], chosen[keep_index]
                ended = [False] * len(keep)
            logits = kv.step(chosen)
        kept_logprobs = logprobs.tolist() if logprobs is not None else None  # one copy for the whole call
        outputs = []
        for row, ids in enumerate(new_ids):
            token_ids, finish_reason, stop_str = truncate_at_stop(ids, self.eos_ids, params.stop, self._decode)
            row_logprobs = kept_logprobs[row][:len(token_ids)] if kept_logprobs is not None else None
            outputs.append(GenerationOutput(token_ids, finish_reason, stop_str, row_logprobs))
        return outputs

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ragged prompt ids -> (input_ids, attention_mask), both [B, P] on the model's device, padding on the
        left."""
        width = max(len(ids) for ids in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, ids in enumerate(rows):
            input_ids[i, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids):] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def truncate_at_stop(ids: list[int], eos_ids: list[int], stops: list[str],
                     decode: Callable[[list[int]], str]) -> tuple[list[int], str, str | None]:
    """Cut one row's generated ids where vLLM would have stopped.

    ``ids`` may run past the end (padding after the row finished). Returns (kept ids, finish_reason,
    stop_str): the ids up to and including the first eos, or the first token whose prefix text
    contains a stop string (the earliest such token; ties go to the first string in ``stops``),
    else all ids with "length".
    """
    eos = set(eos_ids)
    end = next((t + 1 for t, token in enumerate(ids) if token in eos), None)
    searched = ids if end is None else ids[:end - 1]  # eos adds no text
    if stops and any(stop in decode(searched) for stop in stops):
        lo, hi = 1, len(searched)  # smallest prefix length whose text holds a stop string
        while lo < hi:
            mid = (lo + hi) // 2
            if any(stop in decode(searched[:mid]) for stop in stops):
                hi = mid
            else:
                lo = mid + 1
        text = decode(searched[:lo])
        return searched[:lo], "stop", next(stop for stop in stops if stop in text)
    if end is not None:
        return ids[:end], "stop", None
    return ids, "length", None
