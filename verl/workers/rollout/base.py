"""The rollout interfaces: token ids in -> token ids (+ optional log-probs) out.

``Generator`` is what an agent loop needs: ``generate``. Every engine (``vllm_rollout.VLLMRollout``,
``hf_rollout.HFRollout``) is a ``RolloutEngine``: a ``Generator`` on one rank whose weights the
actor on that rank replaces in memory. The driver's ``verl.single_controller.rollout.GroupRollout``
is a ``Generator`` too: it spreads a call over the engines of all actor ranks.
Token-in/token-out: callers pass prompt token ids and get back exactly the ids the engine sampled,
so nothing is decoded and re-encoded between turns of the search loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class SamplingParams:
    """Sampling settings of one ``generate`` call."""

    max_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    n: int = 1  # samples per prompt
    stop: list[str] = field(default_factory=list)  # generation ends after any of these strings (included in output)
    logprobs: bool = False  # also return the sampled tokens' log-probs under the engine
    seed: int | None = None
    # One seed per prompt (overrides ``seed``): prompt i's samples depend on row_seeds[i] only, not on which
    # other prompts share the call (the asynchronous loop batches whatever is pending, so a row's neighbours
    # vary from run to run). With n > 1, sample j of prompt i uses row_seeds[i] + j.
    row_seeds: list[int] | None = None


@dataclass
class GenerationOutput:
    """One sampled continuation."""

    token_ids: list[int]  # the sampled ids, including the stop string's tokens / eos when hit
    finish_reason: str  # "stop" (eos or a stop string) | "length" (max_tokens reached)
    stop_str: str | None = None  # the stop string that ended generation, None for eos/length
    logprobs: list[float] | None = None  # per sampled token, when SamplingParams.logprobs
    # per sampled token, the policy version of the weights that sampled it (set by the driver's GroupRollout: the
    # trainer step whose weights the engine held; None = an engine outside the trainer)
    versions: list[int] | None = None


class Generator(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Continue each prompt; returns ``len(prompts) * params.n`` outputs, grouped by prompt
        (prompt 0's n samples first, then prompt 1's, ...). ``params.seed = s`` makes the call
        reproducible and uses seeds ``s .. s + len(prompts) * n - 1`` only (vLLM: one per sample;
        HF: ``s`` seeds the whole call), so calls given disjoint ranges sample independently.
        ``params.row_seeds`` gives each prompt its own seed instead (see ``SamplingParams``)."""
        ...


class EnginePool(Protocol):
    """Several engines the driver can call one at a time (the asynchronous loop's view of the rollout):
    ``generate_on(e, ...)`` runs on engine ``e`` only, so calls to different engines run concurrently.

    Engines that batch continuously (vLLM) also take ``step_on(e, new, max_steps)``: add the requests ``new`` =
    [(request id, prompt ids, params)] to engine e's running batch and step it until one finishes ->
    (the engines' policy version or None, [(request id, output)] of the finished); ``abort_on(e, ids)`` drops
    requests. ``can_step`` says whether they do."""

    num_engines: int
    can_step: bool

    def generate_on(self, engine: int, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        ...


class SingleEnginePool:
    """One ``Generator`` (an engine in this process: evaluation, inference) as an ``EnginePool`` of one."""

    num_engines = 1

    def __init__(self, generator: Generator):
        self.generator = generator
        self.can_step = hasattr(generator, "step_requests")

    def generate_on(self, engine: int, prompts: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        if engine != 0:
            raise IndexError(f"engine {engine} of a pool of one")
        return self.generator.generate(prompts, params)

    def step_on(self, engine: int, new: list, max_steps: int) -> tuple[int | None, list]:
        return None, self.generator.step_requests(new, max_steps)

    def abort_on(self, engine: int, request_ids: list[str]) -> None:
        self.generator.abort_requests(request_ids)


def as_pool(generator: Generator) -> EnginePool:
    """``generator`` itself when it is an ``EnginePool`` (the driver's ``GroupRollout``), else a pool of one."""
    return generator if hasattr(generator, "generate_on") else SingleEnginePool(generator)


class RolloutEngine(Generator, Protocol):
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with the actor's (HF parameter names), without disk I/O."""
        ...
