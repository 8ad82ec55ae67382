"""The HF engine's decode loop and its parts: sampler, stop check, and the two KV caches it decodes with.

Devices (docs/design.md, "Devices"): the logits, the sampled tokens, the log-probs and every index into the batch live
on the model's device; the only device-to-host copy of a step is the sampled ids (``chosen.tolist()``), which the
stop check needs, and the log-probs come back once per call. ``tests/fake_cuda.py`` runs all of it with the model on
a pretend ``cuda`` device and counts these copies.

* ``Sampler``: temperature, top-k, top-p, then one draw per row: from each row's own ``torch.Generator`` on the
  model's device when the call has row seeds (a row's draws do not depend on the other rows), else from the device's
  global RNG over the whole batch as it began (``model.generate``'s random stream).
* ``StopCheck``: a row ends on an eos id or at the token whose text completes a stop string. Only tokens that can
  complete one (their text holds a stop string's last character: ``stop_candidates``) trigger a decode of the row's
  newest tokens; the others are checked by id. Same ends as decoding every row at every token, at a fraction of
  the host work.
* ``DynamicKV`` (the CPU default): transformers' growing cache; rows that ended leave the batch and the cache once a
  quarter of the batch has ended, so a long row decodes alone instead of with the whole batch.
* ``StaticKV`` (the GPU default): a pre-sized cache (``StaticCache``) for a batch padded to a power of two and a
  length rounded up to ``LENGTH_QUANTUM``, kept between calls of the same shape; each decode step is the same
  kernels on the same buffers, so on CUDA it is captured once as a CUDA graph and replayed (``CudaGraphStep``):
  a decode step then costs one launch instead of hundreds. Rows that ended stay in the batch (on a GPU a row
  costs little next to reading the weights); their tokens are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from verl.workers.rollout.base import SamplingParams

logger = logging.getLogger(__name__)

LENGTH_QUANTUM = 256  # StaticKV's length is rounded up to a multiple of this, so calls share caches and graphs


class Sampler:
    """Picks each batch row's next token from its raw logits, as ``SamplingParams`` ask.

    temperature 0: the most likely token. Otherwise the logits get the temperature, then top-k, then top-p (the
    smallest set of most likely tokens whose probability reaches top_p; at least one token), as vLLM and transformers
    apply them, and one token is drawn: from each row's own generator (on the model's device) when ``seeds`` are
    given, else from the device's global RNG for all ``size`` rows of the batch as it began.

    That last draw keeps ``model.generate``'s random stream: ``torch.multinomial`` draws one token by an exponential
    race over every entry of its [rows, V] input, so what a row draws depends on its place in the batch and the
    batch's size, not on the other rows' values. The rows that left the batch get a placeholder distribution in the
    draw, and the rows still in it draw the tokens they would draw under ``model.generate`` (given the same logits).
    """

    def __init__(self, params: SamplingParams, seeds: list[int] | None, size: int, device: torch.device) -> None:
        self.temperature, self.top_k, self.top_p = params.temperature, params.top_k, params.top_p
        self.generators = None if seeds is None else [
            torch.Generator(device=device).manual_seed(int(s) % 2**63) for s in seeds]
        self.size = size

    def __call__(self, logits: torch.Tensor, rows: list[int], rows_index: torch.Tensor) -> torch.Tensor:
        """``logits`` [b, V] float of the batch rows ``rows`` (indices into the call's rows; ``rows_index`` is the
        same on the logits' device) -> the chosen tokens [b], on the logits' device."""
        if self.temperature == 0:
            return logits.argmax(dim=-1)
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
        if self.generators is None:  # the device's RNG, as model.generate draws
            if len(rows) < self.size:  # rows have left the batch: draw for the whole batch, as model.generate does
                full = probs.new_full((self.size, probs.shape[1]), 1.0 / probs.shape[1])  # [size, V]
                full[rows_index] = probs
                return torch.multinomial(full, 1)[rows_index, 0]
            return torch.multinomial(probs, 1)[:, 0]
        return torch.stack([torch.multinomial(probs[j], 1, generator=self.generators[row])[0]
                            for j, row in enumerate(rows)])


def stop_candidates(tokenizer, stops: list[str]) -> frozenset[int] | None:
    """The ids whose text (decoded alone, special tokens skipped) holds the last character of some stop string: the
    only tokens that can complete one. None = every token can (a stop string ends in whitespace, which a tokenizer's
    decoding may strip from a token's text)."""
    if any(stop[-1].isspace() for stop in stops):
        return None
    last = {stop[-1] for stop in stops}
    partial = any(not ch.isascii() for ch in last)  # a byte-level token may hold part of a multi-byte character
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
    return frozenset(i for i, text in enumerate(texts)
                     if any(ch in text for ch in last) or (partial and "\ufffd" in text))


class StopCheck:
    """Whether a row's newest token ends it: an eos id, or the token at which its text (prompt excluded, special
    tokens skipped) first contains a stop string, as vLLM stops. Only candidate tokens are decoded, and only the
    row's newest ``window`` tokens (enough to hold any stop string); ``truncate_at_stop`` makes the exact cut."""

    def __init__(self, eos_ids: list[int], stops: list[str], candidates: frozenset[int] | None,
                 decode: Callable[[list[int]], str]) -> None:
        self.eos, self.stops, self.candidates, self.decode = set(eos_ids), stops, candidates, decode
        self.window = max(len(stop.encode()) for stop in stops) + 1 if stops else 0

    def ends(self, ids: list[int]) -> bool:
        token = ids[-1]
        if token in self.eos:
            return True
        if not self.stops or (self.candidates is not None and token not in self.candidates):
            return False
        text = self.decode(ids[-self.window:])
        return any(stop in text for stop in self.stops)


class DynamicKV:
    """transformers' growing cache over the rows still in the batch; rows can leave (``keep``)."""

    can_drop = True

    def __init__(self, model) -> None:
        self.model = model

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The prompt pass over ``input_ids`` / ``attention_mask`` [B, P] (left-padded, on the model's device) ->
        the next-token logits [B, V] (float)."""
        positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)  # [B, P], as generate's
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        self.cache, self.attention_mask = out.past_key_values, attention_mask
        return out.logits[:, -1].float()

    def keep(self, positions: torch.Tensor) -> None:
        """Keep only the batch rows at ``positions`` [b'] (on the model's device)."""
        self.cache.batch_select_indices(positions)
        self.attention_mask = self.attention_mask[positions]

    def step(self, chosen: torch.Tensor) -> torch.Tensor:
        """Feed each row's ``chosen`` token [b] -> the next logits [b, V]."""
        mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(len(chosen), 1)], dim=1)  # [b, P + t]
        self.attention_mask = mask
        out = self.model(input_ids=chosen[:, None], attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1].float()


def static_kv_supported(model) -> bool:
    """A model whose static cache is plain full-attention layers (sliding-window layers keep a host-side count)."""
    cache = StaticCache(config=model.config, max_cache_len=1)
    return all(type(layer) is StaticLayer for layer in cache.layers)


class StaticKV:
    """A pre-sized cache for ``width`` rows of up to ``length`` tokens (``StaticCache``), with the decode step's
    inputs in fixed buffers: the step reads and writes the same memory every time, which makes it a CUDA graph.

    Rows beyond the call's ``live`` rows (the batch is padded to ``width``) hold one pad token and are never
    sampled. ``graphs``: capture the decode step as a CUDA graph on its first use (CUDA only)."""

    can_drop = False

    def __init__(self, model, width: int, length: int, pad_id: int, device: torch.device, graphs: bool) -> None:
        self.model, self.width, self.length, self.pad_id = model, width, length, pad_id
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.ids = torch.full((width, 1), pad_id, dtype=torch.long, device=device)  # [W, 1]: the step's input
        self.mask = torch.zeros((width, length), dtype=torch.long, device=device)  # [W, L]: 1 = a real token
        self.positions = torch.zeros((width, 1), dtype=torch.long, device=device)  # [W, 1]
        self.graph = CudaGraphStep(self._forward, self.cache) if graphs else None
        self.filled = self.live = 0

    def fits(self, width: int, length: int) -> bool:
        return (width, length) == (self.width, self.length)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The prompt pass (eager) for the call's rows [B, P], B <= width -> their next-token logits [B, V]."""
        rows, width = input_ids.shape
        self.cache.reset()
        ids = input_ids.new_full((self.width, width), self.pad_id)  # [W, P]
        mask = attention_mask.new_zeros((self.width, width))  # [W, P]
        ids[:rows], mask[:rows] = input_ids, attention_mask
        mask[rows:, -1] = 1  # padding rows: one real (pad) token, so their attention is never empty
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.mask.zero_()
        self.mask[:, :width] = mask
        self.ids.fill_(self.pad_id)
        self.filled, self.live = width, rows
        return out.logits[:rows, -1].float()

    def step(self, chosen: torch.Tensor) -> torch.Tensor:
        """Feed the live rows' ``chosen`` tokens [B] -> their next logits [B, V]."""
        self.ids[:self.live, 0] = chosen
        self.mask[:, self.filled] = 1  # the new token's column: its key and value go there
        self.filled += 1
        torch.sub(self.mask.sum(-1, keepdim=True), 1, out=self.positions)
        logits = self.graph() if self.graph is not None else self._forward()
        return logits[:self.live]

    def _forward(self) -> torch.Tensor:
        out = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.positions,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1].float()  # [W, V]


class CudaGraphStep:
    """``forward`` (a decode step that reads and writes only fixed buffers) captured as a CUDA graph on its first
    call, replayed after. The capture's warm-up runs the step once for real; the caches' lengths are put back so that
    the replay does that step. A capture that fails (an op the graph cannot hold) logs why and runs eagerly from then
    on: the run goes on, slower."""

    def __init__(self, forward: Callable[[], torch.Tensor], cache: StaticCache) -> None:
        self.forward, self.cache = forward, cache
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None
        self.failed = False

    def __call__(self) -> torch.Tensor:
        if self.failed:
            return self.forward()
        if self.graph is None:
            try:
                self._capture()
            except RuntimeError as err:
                logger.warning("the decode step could not be captured as a CUDA graph (%s); decoding without graphs",
                               err)
                self.failed = True
                self.graph = None
                return self.forward()
        self.graph.replay()
        return self.output

    def _capture(self) -> None:
        lengths = [layer.cumulative_length.clone() for layer in self.cache.layers]
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.forward()  # warm-up: lazy allocations and kernel choices happen outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.output = self.forward()
            self.graph = graph
        finally:  # the warm-up (and a failed capture) moved the caches on: the step is still to be done
            for layer, length in zip(self.cache.layers, lengths, strict=True):
                layer.cumulative_length.copy_(length)
