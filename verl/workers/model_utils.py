"""Model code shared by the actor, critic and reference workers: loading, the forward over the response,
micro-batching.

What a model directory must hold is checked by ``model_files.py``; devices, ranks and FSDP2 sharding are in
``distributed.py``; this process's memory (peaks, the host allocator) in ``process_memory.py``.

Choices:

* **Any Hugging Face model** loaded with an ``AutoModel*`` class; the actor and the reference use
  ``AutoModelForCausalLM``, the critic ``AutoModelForTokenClassification`` (see ``critic.py``).
* **Dropout off.** Every ``nn.Dropout`` gets ``p = 0``: the log-probs of ``compute_log_prob`` and of
  the update must be the same function of the weights (PPO ratio exactly 1 before the first step),
  and data-parallel ranks must agree. Trainable models stay in train mode so gradient checkpointing
  (which transformers runs only in train mode) works.
* **Precision.** Trainable weights (and so AdamW's state) stay float32; a training dtype of bfloat16 /
  float16 (``actor.fsdp_config.dtype``, ``critic.model.fsdp_config.dtype``) runs the forward under
  ``torch.autocast``. The frozen reference is loaded in ``ref.fsdp_config.dtype``. The rollout engine's
  dtype (``rollout.dtype``) is its own.
* **Sharding** (``distributed.shard_model``): with torch.distributed initialised and world size > 1 (or CPU offload),
  the loaded model is sharded with FSDP2 layer by layer.
* **Response slice.** Rows are ``[left-padded prompt | right-padded response]`` (``verl.utils.seq``);
  token t of the response is predicted by the output at column P-1+t, so a forward returns the
  outputs at columns P-1 .. P+R-2. Before the forward, columns that are padding in every row of the
  micro-batch are cut (leading prompt padding, trailing response padding) and outputs are padded
  back to R with zeros; the cut columns are masked anyway, so this changes cost, not results.
* **Dynamic batching** (``use_dynamic_bsz``): rows are taken longest response first (then longest prompt) and
  grouped so that rows x cut width stays under a token budget; all ranks then use the same number of
  micro-batches (FSDP runs one collective per forward, so a rank with fewer would hang). A micro-batch is as wide
  as its widest row, so grouping rows of like length computes less padding than batch order (a search agent's
  batch mixes short answers and 1,200-token searches: 11-28 % fewer tokens on the Wikipedia GRPO steps,
  ``benchmarks/bench_micro_batches.py``); the forward passes give their outputs back in batch order
  (``MicroBatches.in_batch_order``). verl's dynamic batching also regroups rows (balancing their lengths) and
  restores the order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from verl.algorithms.logprobs import logprobs_and_entropy
from verl.protocol import Batch
from verl.workers.distributed import all_reduce_, init_single_process_group, shard_model, world
from verl.workers.lora import LoraSpec, add_lora
from verl.workers.scored_tokens import ScoredTokens, head_logits, head_on

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``trainer.device`` -> a torch device: auto = this process's CUDA device if there is one, else CPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


# Models with more parameters than this recompute activations in the backward pass unless the
# config says otherwise (model.enable_gradient_checkpointing: null).
GRADIENT_CHECKPOINTING_ABOVE = 1_000_000_000


def load_model(auto_cls: type, path: str, *, device: torch.device, dtype: torch.dtype, seed: int,
               trainable: bool, gradient_checkpointing: bool | None = False, trust_remote_code: bool = False,
               lora: LoraSpec | None = None, offload: bool = False, **model_kwargs) -> nn.Module:
    """Load ``auto_cls.from_pretrained(path)`` ready for a worker: dropout off, on ``device``, sharded if distributed.

    Args:
        dtype: parameter dtype (float32 for trainable models; see the module docstring).
        seed: seeds the initialisation of weights absent from the checkpoint (e.g. a value head or
            LoRA adapters), identical on every rank.
        trainable: train mode with gradients, else eval mode with ``requires_grad=False``.
        gradient_checkpointing: None = on above ``GRADIENT_CHECKPOINTING_ABOVE`` parameters.
        lora: wrap in LoRA adapters (peft); only they require gradients.
        offload: FSDP2 CPU offload of parameters, gradients and optimiser state; shards the model
            even in a single process (a world of one is started if none is).
        model_kwargs: passed to ``from_pretrained`` (e.g. ``num_labels=1``).
    """
    torch.manual_seed(seed)
    model = auto_cls.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code, **model_kwargs)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    if gradient_checkpointing is None:
        gradient_checkpointing = sum(p.numel() for p in model.parameters()) > GRADIENT_CHECKPOINTING_ABOVE
    if trainable:
        model.train()
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.eval()
        model.requires_grad_(False)
    if lora is not None:
        model = add_lora(model, lora)
    model.to(device)
    if offload:
        init_single_process_group(device)
    if world()[1] > 1 or offload:
        shard_model(model, device, offload)
    return model


def autocast(device: torch.device, dtype: torch.dtype) -> torch.autocast:
    """Mixed-precision context for a float32 model computing in ``dtype`` (disabled for float32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


# ----------------------------------------------------------------------------------------------
# Forward over the response
# ----------------------------------------------------------------------------------------------


def _cut_padding(batch: Batch) -> tuple[Tensor, Tensor, Tensor, int]:
    """Drop columns that are padding in every row; returns (input_ids, attention_mask, position_ids, kept R).

    The prompt column P-1 is always kept: it predicts the first response token.
    """
    attention_mask = batch["attention_mask"]  # [b, P+R]
    R = batch["responses"].shape[1]
    P = attention_mask.shape[1] - R
    real = attention_mask.any(dim=0)  # [P+R]
    real_cols = real.nonzero().flatten()
    first = min(int(real_cols[0]), P - 1) if len(real_cols) else P - 1
    last = max(int(real_cols[-1]), P - 1) if len(real_cols) else P - 1
    cols = slice(first, last + 1)
    return batch["input_ids"][:, cols], attention_mask[:, cols], batch["position_ids"][:, cols], last - P + 1


def response_outputs(model: nn.Module, batch: Batch, device: torch.device, dtype: torch.dtype,
                     head: Callable[[Tensor, Tensor], Tensor | tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """Run ``model`` (a value model: every column's output is computed) on a micro-batch and apply ``head`` to its
    outputs at the response columns. Causal LMs go through ``response_log_probs``.

    Args:
        batch: ``input_ids``, ``attention_mask``, ``position_ids`` [b, P+R], ``responses`` [b, R].
        head: ``head(outputs [b, r, ...], responses [b, r]) -> [b, r]`` tensor(s), r <= R the kept
            response columns; ``outputs`` are the model's logits at columns P-1 .. P+r-2.
    Returns the head's tensors [b, R] on ``device``, 0 at response padding (whatever the micro-batch).
    """
    input_ids, attention_mask, position_ids, r = _cut_padding(batch)
    responses = batch["responses"]
    R = responses.shape[1]
    kwargs = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
              "position_ids": position_ids.to(device), "use_cache": False}
    with autocast(device, dtype):
        logits = model(**kwargs).logits[:, -r - 1:-1]  # [b, r, ...]
    out = head(logits, responses[:, :r].to(device))
    out = out if isinstance(out, tuple) else (out,)
    real = attention_mask[:, attention_mask.shape[1] - r:].to(device)  # [b, r], 1 = a real response token
    return tuple(torch.nn.functional.pad(t * real, (0, R - r)) for t in out)  # each [b, R]


def response_log_probs(model: nn.Module, batch: Batch, device: torch.device, dtype: torch.dtype,
                       with_entropy: bool = False, entropy_grad: bool = False,
                       every_token: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [b, R] of ``responses`` under a causal LM, and the policy entropy [b, R] if asked.

    ``entropy_grad`` keeps the entropy in the autograd graph (an entropy bonus); otherwise it is
    computed without gradient (a metric). Both come from ``logprobs.logprobs_and_entropy`` over
    token chunks, so the model's logits are the only [n, V] tensor. With a ``loss_mask`` in the batch only the
    tokens something reads are scored (``scored_tokens.py``: n of them; ``every_token``: all real ones); 0 at the
    others and at padding.
    """
    input_ids, attention_mask, position_ids, r = _cut_padding(batch)
    # the LM head on the scored tokens only (scored_tokens.py): the kept r + 1 columns' column k predicts token k
    scored = ScoredTokens.of(batch, r, device, every_token)
    responses = batch["responses"]
    index = scored.rows * (r + 1) + scored.cols  # [n] into the head's input [b * (r + 1)]
    with autocast(device, dtype), head_on(model, index) as head_input:
        logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                       position_ids=position_ids.to(device), use_cache=False, logits_to_keep=r + 1).logits
    labels = responses.to(device)[scored.rows, scored.cols][None]  # [1, n]
    log_prob, entropy = logprobs_and_entropy(head_logits(logits, head_input, index), labels, with_entropy,
                                             entropy_grad)  # [1, n] each
    rows, R = responses.shape
    return scored.scatter(log_prob[0], rows, R), (scored.scatter(entropy[0], rows, R) if with_entropy else None)


# ----------------------------------------------------------------------------------------------
# Micro-batching
# ----------------------------------------------------------------------------------------------


class MicroBatches(list[Batch]):
    """A batch split for the forward passes: a list of micro-batches; ``rows[k]`` are the batch's rows that
    micro-batch ``k`` holds, in that order."""

    def __init__(self, batches: list[Batch], rows: list[list[int]]) -> None:
        super().__init__(batches)
        self.rows = rows

    def in_batch_order(self, outputs: list[Tensor]) -> Tensor:
        """Per-micro-batch outputs ``[b_k, ...]`` as one ``[B, ...]`` tensor in the batch's row order."""
        order = [i for rows in self.rows for i in rows]
        out = torch.cat(outputs)
        if order == list(range(len(order))):
            return out
        return out[torch.as_tensor(order).argsort()]  # position of batch row i among the concatenated rows


def row_spans(attention_mask: Tensor) -> tuple[list[int], list[int]]:
    """Per row, the first and last column that is not padding. ``[B, T] -> ([B], [B])``."""
    cols = torch.arange(attention_mask.shape[1])
    real = attention_mask.bool()
    first = torch.where(real, cols, attention_mask.shape[1]).min(dim=1).values.tolist()
    last = torch.where(real, cols, -1).max(dim=1).values.tolist()
    return first, last


# What one more forward (and backward) call costs, in tokens of a micro-batch: its fixed work (the weights read,
# the per-layer dispatch, and a shared prompt prefix run again) against the rows' own. Measured on SmolLM2-135M,
# bfloat16, 2 CPU cores, a real GRPO step's 24 rows (docs/history/results-journal.md, "Token-budget micro-batches
# cut at the fewest tokens"): 12 micro-batches took 33 s, 6 took 25-28 s and 3 took 22-24 s for the same tokens,
# about 1 s a call, as much as ~250 tokens of the update.
CALL_TOKENS = 256


def budget_groups(order: list[int], first: list[int], last: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive runs of ``order`` (rows sorted longest first) with (rows in group) x (group width: ``min(first)``
    .. ``max(last)``) <= ``max_tokens`` (a row wider than the budget goes alone), cut where they compute the fewest
    tokens: the sum over groups of rows x width plus ``CALL_TOKENS`` a group (exact, by dynamic programming over the
    cut points). Filling each group up to the budget instead pads a batch's few long rows' group with short rows to
    their width: a GRPO step with 3 rows cut at 640 response tokens among 21 of ~200 spent 49 s in its update
    against 33-38 s (docs/history/results-journal.md)."""
    n = len(order)
    best = [0] + [float("inf")] * n  # best[i]: the least cost of grouping order[:i]
    cut = [0] * (n + 1)  # cut[i]: where the last group of order[:i] starts
    for i in range(1, n + 1):
        lo, hi = first[order[i - 1]], last[order[i - 1]]
        for j in range(i - 1, -1, -1):  # the last group is order[j:i]; it grows leftwards
            lo, hi = min(lo, first[order[j]]), max(hi, last[order[j]])
            tokens = (i - j) * (hi - lo + 1)
            if tokens > max_tokens and j < i - 1:
                break  # a larger group is no narrower: none fits either
            if best[j] + tokens + CALL_TOKENS < best[i]:
                best[i], cut[i] = best[j] + tokens + CALL_TOKENS, j
    groups: list[list[int]] = []
    i = n
    while i:
        groups.insert(0, order[cut[i]:i])
        i = cut[i]
    return groups


def micro_batches(batch: Batch, rows: int, max_tokens: int | None = None) -> MicroBatches:
    """Split ``batch`` into micro-batches of ``rows`` consecutive rows, or by token budget when ``max_tokens`` is set.

    With a budget, rows are taken in order of their last real column, latest first (the longest responses; ties:
    the longest prompt first, then batch order), and cut into runs with (rows in run) x (run width without
    all-padding columns) <= max_tokens (a row wider than the budget goes alone) where they compute the fewest
    tokens (``budget_groups``); every rank then splits its largest groups until all ranks have the same count.
    Outputs go back to batch order with ``in_batch_order``.
    """
    if max_tokens is None:
        chunks = [list(range(i, min(i + rows, len(batch)))) for i in range(0, len(batch), rows)]
        return MicroBatches(batch.split(rows), chunks)
    first, last = row_spans(batch["attention_mask"])  # [B] each
    groups = budget_groups(sorted(range(len(batch)), key=lambda i: (-last[i], first[i], i)), first, last, max_tokens)
    count = all_reduce_(torch.tensor([len(groups)]), dist.ReduceOp.MAX).item()
    while len(groups) < count:
        k = max(range(len(groups)), key=lambda g: len(groups[g]))
        big = groups.pop(k)
        groups[k:k] = [big[: len(big) // 2], big[len(big) // 2:]]
    return MicroBatches([batch.index(g) for g in groups], groups)
