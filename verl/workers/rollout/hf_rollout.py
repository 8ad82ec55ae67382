"""Rollout engine on a transformers model: token ids in, sampled token ids (+ log-probs) out.

The reference engine and the default (the faster one for the tiny demo policy on CPU; also the one used where vLLM is
not installed, e.g. the GPU machine). It behaves like ``VLLMRollout`` so the two are interchangeable:
- Prompts are left-padded into micro-batches of ``micro_batch_size`` rows (after expanding each
  prompt ``n`` times, so samples stay grouped by prompt), run once through the model (the prompt pass, keeping the
  KV cache), then decoded one token a step. Position ids come from the attention mask, as ``model.generate``
  derives them, so padding does not shift positions.
- Rows leave the batch as they end: once a quarter or more of the rows still in the batch have ended (eos, a stop
  string), those rows are dropped from the batch and from the KV cache (``Cache.batch_select_indices``). A batch
  thus no longer pays its full width for every token of its longest row: a row that runs to ``max_tokens`` while
  the others stopped early decodes alone (about 3x cheaper a token than a batch of 24 for SmolLM2-135M on a CPU).
  ``model.generate`` keeps every row to the end; this loop replaced it for that reason.
- Sampling comes only from ``SamplingParams`` (``_Sampler``), never from the checkpoint's ``generation_config``
  (repetition penalty, top-k, ... cannot leak in), as with vLLM given explicit sampling params. temperature 0 =
  greedy; top_k -1 and top_p 1 = off. Eos ids are the tokenizer's eos plus the checkpoint's ``eos_token_id``(s), as
  vLLM.
- Stop strings follow vLLM: generation of a row ends at the first token whose detokenised output
  (special tokens skipped, prompt excluded) contains a stop string; that token is kept and
  everything after it dropped, so ``token_ids`` are exactly the sampled ids up to the stop string /
  eos; ``finish_reason`` is "stop" (eos or stop string, ``stop_str`` names the string) or "length".
  Each step decodes only a short window of the row's newest tokens (cheap); the exact cut is made afterwards on
  the full text (``truncate_at_stop``).
- Log-probs are the model's raw log-softmax (no temperature, top-k or top-p applied) of each
  sampled token, the same quantity as vLLM's default ``raw_logprobs``; memory stays O(batch x vocab): the prompt
  pass computes the logits of the last position only.
- Seeds: a call with ``seed`` runs under that torch seed (inside ``fork_rng``, so the global RNG is
  untouched); a call without draws its seed from the engine's generator seeded once by ``seed``.
  A call with ``row_seeds`` samples each row with its own ``torch.Generator``, so a row's tokens do not
  depend on the other rows of the call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

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
        """One left-padded batch through the decode loop (the module docstring); rows leave the batch as they end."""
        input_ids, attention_mask = self._left_pad(rows)  # [B, P]
        positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)  # [B, P], as generate's
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1].float()  # [b, V]: the next-token logits of the rows still in the batch
        draw = _Sampler(params, seeds, len(rows))
        window = max(len(stop.encode()) for stop in params.stop) + 1 if params.stop else 0
        eos = set(self.eos_ids)
        new_ids: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        batch = torch.arange(len(rows))  # [b]: the row of each batch position
        ended = torch.zeros(len(rows), dtype=torch.bool)  # [b]: ended rows not yet removed from the batch
        for step in range(params.max_tokens):
            chosen = draw(logits, batch)  # [b]
            if params.logprobs:
                picked = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])[:, 0].tolist()
            for j, (row, token) in enumerate(zip(batch.tolist(), chosen.tolist(), strict=True)):
                if ended[j]:
                    continue
                new_ids[row].append(token)
                if params.logprobs:
                    logprobs[row].append(picked[j])
                tail = new_ids[row][-window:] if window else ()
                ended[j] = token in eos or any(stop in self._decode(tail) for stop in params.stop)
            if bool(ended.all()) or step + 1 == params.max_tokens:
                break
            if 4 * int(ended.sum()) >= len(batch):  # a quarter or more of the batch has ended: drop those rows
                keep = (~ended).nonzero()[:, 0]  # [b']
                cache.batch_select_indices(keep.to(self.device))
                batch, ended, chosen = batch[keep], ended[keep], chosen[keep]
                attention_mask = attention_mask[keep.to(self.device)]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(batch), 1)], dim=1)  # [b, P + t]
            out = self.model(input_ids=chosen[:, None].to(self.device), attention_mask=attention_mask,
                             position_ids=attention_mask.sum(-1, keepdim=True) - 1, past_key_values=cache,
                             use_cache=True)
            logits = out.logits[:, -1].float()
        outputs = []
        for row, ids in enumerate(new_ids):
            token_ids, finish_reason, stop_str = truncate_at_stop(ids, self.eos_ids, params.stop, self._decode)
            row_logprobs = logprobs[row][:len(token_ids)] if params.logprobs else None
            outputs.append(GenerationOutput(token_ids, finish_reason, stop_str, row_logprobs))
        return outputs

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


class _Sampler:
    """Picks each batch row's next token from its raw logits, as ``SamplingParams`` ask.

    temperature 0: the most likely token. Otherwise the logits get the temperature, then top-k, then top-p (the
    smallest set of most likely tokens whose probability reaches top_p; at least one token), as vLLM and transformers
    apply them, and one token is drawn: from each row's own ``torch.Generator`` when ``seeds`` are given (a row's
    draws then do not depend on the other rows, nor on which rows are still in the batch), else from the global
    torch RNG (seeded per call by ``HFRollout.generate``), for all ``size`` rows of the batch as it began.

    That last draw keeps ``model.generate``'s random stream: ``torch.multinomial`` draws one token by an exponential
    race over every entry of its [rows, V] input, so what a row draws depends on its place in the batch and the
    batch's size, not on the other rows' values. The rows that left the batch get a placeholder distribution in the
    draw, and the rows still in it draw the tokens they would draw under ``model.generate`` (given the same logits).
    """

    def __init__(self, params: SamplingParams, seeds: list[int] | None, size: int) -> None:
        self.temperature, self.top_k, self.top_p = params.temperature, params.top_k, params.top_p
        self.generators = None if seeds is None else [torch.Generator().manual_seed(int(s) % 2**63) for s in seeds]
        self.size = size

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``logits`` [b, V] float of the batch rows ``rows`` [b] (indices into the call's rows) -> tokens [b]."""
        if self.temperature == 0:
            return logits.argmax(dim=-1).cpu()
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= self.top_p  # the mass before a token already reaches top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        if self.generators is None:  # on the model's device, with its RNG, as model.generate draws
            if len(rows) < self.size:  # rows have left the batch: draw for the whole batch, as model.generate does
                full = probs.new_full((self.size, probs.shape[1]), 1.0 / probs.shape[1])  # [size, V]
                kept = rows.to(probs.device)
                full[kept] = probs
                return torch.multinomial(full, 1)[kept, 0].cpu()
            return torch.multinomial(probs, 1)[:, 0].cpu()
        probs = probs.cpu()  # the rows' own generators are CPU generators
        return torch.stack([torch.multinomial(probs[j], 1, generator=self.generators[row])[0]
                            for j, row in enumerate(rows.tolist())])
