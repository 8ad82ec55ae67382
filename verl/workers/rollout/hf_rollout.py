"""Rollout engine on transformers' ``generate``: token ids in, sampled token ids (+ log-probs) out.

The reference engine and the default (the faster one for the tiny demo policy on CPU; also the one used where vLLM is
not installed, e.g. the GPU machine). It behaves like ``VLLMRollout`` so the two are interchangeable:
- Prompts are left-padded into micro-batches of ``micro_batch_size`` rows (after expanding each
  prompt ``n`` times, so samples stay grouped by prompt) and generated with the KV cache;
  transformers derives position ids from the attention mask, so padding does not shift positions.
- Sampling comes only from ``SamplingParams``: the model's own ``generation_config`` is replaced by
  a neutral one holding just eos/pad, so checkpoint defaults (repetition penalty, top-k, ...)
  cannot leak in, as with vLLM given explicit sampling params. temperature 0 = greedy; top_k -1 and
  top_p 1 = off. Eos ids are the tokenizer's eos plus the checkpoint's ``eos_token_id``(s), as vLLM.
- Stop strings follow vLLM: generation of a row ends at the first token whose detokenised output
  (special tokens skipped, prompt excluded) contains a stop string; that token is kept and
  everything after it dropped, so ``token_ids`` are exactly the sampled ids up to the stop string /
  eos; ``finish_reason`` is "stop" (eos or stop string, ``stop_str`` names the string) or "length".
  A stopping criterion checks only a short window of recent tokens per step (cheap); the exact cut
  is made afterwards on the full text.
- Log-probs are the model's raw log-softmax (no temperature, top-k or top-p applied) of each
  sampled token, the same quantity as vLLM's default ``raw_logprobs``. They are gathered step by
  step by a logits processor placed before the sampling warpers, so memory stays O(batch x vocab).
- Seeds: a call with ``seed`` runs under that torch seed (inside ``fork_rng``, so the global RNG is
  untouched); a call without draws its seed from the engine's generator seeded once by ``seed``.
  A call with ``row_seeds`` samples each row with its own ``torch.Generator`` (``_RowSampler``: the
  temperature, top-k and top-p of ``SamplingParams`` applied to the row's logits, then one draw), so a
  row's tokens do not depend on the other rows of the call; ``generate`` then only takes the drawn token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from verl.workers.model_utils import DTYPES
from verl.workers.rollout.base import GenerationOutput, SamplingParams

logger = logging.getLogger(__name__)


class HFRollout:
    """``RolloutEngine`` backed by ``model.generate`` (see the module docstring)."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu", micro_batch_size: int = 64,
                 seed: int = 0) -> None:
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
        outputs: list[GenerationOutput] = []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(call_seed)
            for start in range(0, len(rows), self.micro_batch_size):
                stop = start + self.micro_batch_size
                outputs.extend(self._generate_micro_batch(rows[start:stop], params,
                                                          None if seeds is None else seeds[start:stop]))
        return outputs

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the actor's tensors (HF names, any subset) into the model in place, one at a time (the
        iterator is not materialised; a tied weight updates both of its names)."""
        own = self.model.state_dict()  # tensors sharing storage with the parameters
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in own:
                    raise KeyError(f"sync_weights got a name the model does not have: {name!r}")
                own[name].copy_(tensor)

    def _generate_micro_batch(self, rows: list[list[int]], params: SamplingParams,
                              seeds: list[int] | None) -> list[GenerationOutput]:
        input_ids, attention_mask = self._left_pad(rows)  # [B, P]
        prompt_len = input_ids.shape[1]
        recorder = _SampledLogprobs() if params.logprobs else None
        # per-row draws (row_seeds): the processor picks each row's token, generate's own sampling is off
        sampler = _RowSampler(params, seeds) if seeds is not None and params.temperature > 0 else None
        config = self._generation_config(params if sampler is None else
                                         SamplingParams(max_tokens=params.max_tokens, temperature=0))
        processors = [p for p in (recorder, sampler) if p is not None]  # the recorder first: raw logits
        criteria = [_StopStringsInWindow(self._decode, params.stop, prompt_len)] if params.stop else []
        sequences = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
            logits_processor=LogitsProcessorList(processors),
            stopping_criteria=StoppingCriteriaList(criteria),
        )  # [B, P + T]
        new_ids = sequences[:, prompt_len:].tolist()  # [B][T]
        logprobs = recorder.finish(sequences).tolist() if recorder else None  # [B][T]
        outputs = []
        for i, ids in enumerate(new_ids):
            token_ids, finish_reason, stop_str = truncate_at_stop(ids, self.eos_ids, params.stop, self._decode)
            row_logprobs = logprobs[i][:len(token_ids)] if logprobs else None
            outputs.append(GenerationOutput(token_ids, finish_reason, stop_str, row_logprobs))
        return outputs

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        sampling = {"do_sample": False} if params.temperature == 0 else {
            "do_sample": True, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": 0 if params.top_k == -1 else params.top_k,  # 0 = off in transformers
        }
        return GenerationConfig(max_new_tokens=params.max_tokens, eos_token_id=self.eos_ids, pad_token_id=self.pad_id,
                                **sampling)

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ragged prompt ids -> (input_ids, attention_mask), both [B, P], padding on the left."""
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


class _SampledLogprobs(LogitsProcessor):
    """Records log p(sampled token) under the raw logits, one step behind the sampler.

    Called with the raw logits of step t ([B, V], before temperature/top-k/top-p, which generate
    applies after custom processors); at step t+1 ``input_ids[:, -1]`` is the token sampled at t.
    """

    def __init__(self) -> None:
        self.pending: torch.Tensor | None = None  # [B, V] log-softmax of the last step
        self.values: list[torch.Tensor] = []  # T-1 tensors of [B]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._gather(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs of all generated tokens, [B, T] (T = steps run)."""
        self._gather(sequences[:, -1])
        return torch.stack(self.values, dim=1).cpu()

    def _gather(self, sampled: torch.Tensor) -> None:
        if self.pending is not None:
            self.values.append(self.pending.gather(1, sampled[:, None]).squeeze(1))
            self.pending = None


class _RowSampler(LogitsProcessor):
    """Draws each row's next token with the row's own generator; returns logits that let only it be chosen.

    The row's logits get ``SamplingParams``' temperature, then top-k, then top-p (the smallest set of most
    likely tokens whose probability reaches top_p; at least one token), as vLLM and transformers apply them.
    """

    def __init__(self, params: SamplingParams, seeds: list[int]) -> None:
        self.temperature, self.top_k, self.top_p = params.temperature, params.top_k, params.top_p
        self.generators = [torch.Generator().manual_seed(int(seed) % 2**63) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float() / self.temperature  # [B, V]
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= self.top_p  # the mass before a token already reaches top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs.cpu()
        chosen = torch.stack([torch.multinomial(probs[b], 1, generator=self.generators[b])[0]
                              for b in range(probs.shape[0])]).to(scores.device)  # [B]
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, chosen[:, None], 0.0)
        return out


class _StopStringsInWindow(StoppingCriteria):
    """Marks rows done once a stop string appears in the text of their last few generated tokens.

    The window holds ``max stop-string bytes + 1`` tokens: every token spans at least one byte,
    so a stop string completed by the newest token lies inside it.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str], prompt_len: int) -> None:
        self.decode = decode
        self.stops = stops
        self.prompt_len = prompt_len
        self.window = max(len(stop.encode()) for stop in stops) + 1

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        start = max(self.prompt_len, input_ids.shape[1] - self.window)
        tails = input_ids[:, start:].tolist()  # [B][<= window]
        done = [any(stop in self.decode(tail) for stop in self.stops) for tail in tails]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
