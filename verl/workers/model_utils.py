"""Model code shared by the actor, critic and reference workers: loading, sharding, forward, micro-batching.

Choices:

* **Any Hugging Face model** loaded with an ``AutoModel*`` class; the actor and the reference use
  ``AutoModelForCausalLM``, the critic ``AutoModelForTokenClassification`` (see ``critic.py``).
* **Checked before loading.** ``check_model_files`` (``check_models`` for a config) reads a model
  directory's JSON files, config and tokenizer and the weights files' headers and sizes, so a damaged
  directory is one error naming the file before any worker starts, not a traceback from a worker.
* **Dropout off.** Every ``nn.Dropout`` gets ``p = 0``: the log-probs of ``compute_log_prob`` and of
  the update must be the same function of the weights (PPO ratio exactly 1 before the first step),
  and data-parallel ranks must agree. Trainable models stay in train mode so gradient checkpointing
  (which transformers runs only in train mode) works.
* **Precision.** Trainable weights (and so AdamW's state) stay float32; a training dtype of bfloat16 /
  float16 (``actor.fsdp_config.dtype``, ``critic.model.fsdp_config.dtype``) runs the forward under
  ``torch.autocast``. The frozen reference is loaded in ``ref.fsdp_config.dtype``. The rollout engine's
  dtype (``rollout.dtype``) is its own.
* **Sharding.** With ``torch.distributed`` initialised and world size > 1, each decoder layer (the
  classes the model lists in ``_no_split_modules``) and then the root are wrapped with FSDP2
  ``fully_shard`` on a 1-D mesh (gloo on CPU, nccl on GPU). Every rank seeds identically before
  building, so the shards come from one initialisation.
* **Response slice.** Rows are ``[left-padded prompt | right-padded response]`` (``verl.utils.seq``);
  token t of the response is predicted by the output at column P-1+t, so a forward returns the
  outputs at columns P-1 .. P+R-2. Before the forward, columns that are padding in every row of the
  micro-batch are cut (leading prompt padding, trailing response padding) and outputs are padded
  back to R with zeros; the cut columns are masked anyway, so this changes cost, not results.
* **Dynamic batching** (``use_dynamic_bsz``): consecutive rows are grouped so that rows x cut width
  stays under a token budget; all ranks then use the same number of micro-batches (FSDP runs one
  collective per forward, so a rank with fewer would hang).
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import resource
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

from verl.algorithms.logprobs import logprobs_and_entropy
from verl.config import Config, ConfigError, max_sequence_length, uses_critic
from verl.protocol import Batch
from verl.workers.lora import LoraSpec, add_lora

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ----------------------------------------------------------------------------------------------
# Devices and processes
# ----------------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    """``trainer.device`` -> a torch device: auto = this process's CUDA device if there is one, else CPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def world() -> tuple[int, int]:
    """(rank, world_size) of the default process group; (0, 1) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


_lifetime_peak_kib = 0  # the process's peak resident set before the last high-water-mark reset


def peak_memory_metrics(device: torch.device) -> dict[str, float]:
    """This rank's peak memory since the previous call (one training step when called once per step), then reset:
    on a GPU the most allocated (``perf/max_memory_allocated_gb``); on the host the peak resident set
    (``perf/step_max_rss_gb``, Linux: the kernel's high-water mark, reset through ``/proc/self/clear_refs``).
    Also the process's peak resident set since it started (``perf/max_rss_gb``, never reset) and its resident set
    now (``perf/rss_gb``: what the allocator keeps between steps)."""
    global _lifetime_peak_kib
    # the kernel's peak (also what getrusage reports) since the last reset here; the lifetime peak is kept apart
    _lifetime_peak_kib = max(_lifetime_peak_kib, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    metrics = {"perf/max_rss_gb": _lifetime_peak_kib / (1 << 20)}  # KiB -> GiB
    status = _proc_status()
    if "VmHWM" in status:
        metrics["perf/step_max_rss_gb"] = status["VmHWM"] / (1 << 20)
        metrics["perf/rss_gb"] = status["VmRSS"] / (1 << 20)
        _reset_high_water_mark()
    if device.type == "cuda":
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / (1 << 30)
        torch.cuda.reset_peak_memory_stats(device)
    return metrics


def release_host_memory() -> None:
    """Give the host allocator's free pages back to the system (glibc's ``malloc_trim(0)``, every arena); a no-op
    where there is none. Freed tensors of one size rarely fit the next micro-batch's other sizes, and the generation
    thread's arena is not reused by the training thread's, so without it the resident set grows to the sum of the
    phases' peaks (measured: docs/results.md, "Memory over a long run")."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


@functools.cache
def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function ``name``, or None where there is no glibc (or no such function)."""
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
HOST_MMAP_THRESHOLD = 1 << 20  # bytes


def map_large_host_allocations(threshold: int = HOST_MMAP_THRESHOLD) -> bool:
    """Serve every host allocation of ``threshold`` bytes or more from its own mapping, unmapped when freed (glibc's
    ``mallopt(M_MMAP_THRESHOLD)``); True when set. glibc raises its threshold to the size of each mapped block freed
    (up to 32 MiB), so after the first freed activations every tensor below 32 MiB comes from the heap, where one
    micro-batch's freed tensors leave holes the next one's sizes do not fit, and a step's peak grows by what the holes
    hold (measured on the real model: 7.8 -> 6.4 GiB on the same batches; docs/results.md, "Memory over a run"). A
    fixed threshold also stops the raise. Left alone where glibc is absent or the user set it
    (``MALLOC_MMAP_THRESHOLD_``, or ``mmap_threshold`` in ``GLIBC_TUNABLES``)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = _glibc("mallopt")
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, threshold) == 1



def _proc_status() -> dict[str, int]:
    """VmHWM / VmRSS of this process in KiB (Linux /proc/self/status; empty elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            return {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith(("VmHWM", "VmRSS"))}
    except OSError:
        return {}


def _reset_high_water_mark() -> None:
    """Reset VmHWM to the current resident set (Linux >= 4.0: writing 5 to clear_refs); silently kept elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def all_reduce_(x: Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Tensor:
    """In-place all-reduce over the default group (through the GPU under nccl); a no-op in a single
    process. Returns ``x``."""
    if world()[1] > 1:
        on_gpu = dist.get_backend() == "nccl"
        y = x.to(torch.device("cuda", torch.cuda.current_device())) if on_gpu else x
        dist.all_reduce(y, op=op)
        x.copy_(y)
    return x


# ----------------------------------------------------------------------------------------------
# Loading and sharding
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


JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json")
WEIGHTS_HINT = ("model.safetensors, model-*.safetensors shards with model.safetensors.index.json, or "
                "pytorch_model.bin")


def check_model_files(path: str, trust_remote_code: bool = False, tokenizer: bool = True) -> None:
    """Check, without loading the weights, that the model at ``path`` will load: its JSON files parse,
    transformers reads its config (and ``tokenizer``), and every weights file is whole (a safetensors file's
    header and size, a zipped ``.bin``'s directory). A Hub id (no such local directory) gets the config and
    tokenizer checks only. Raises ValueError naming the file and what is wrong, so a damaged model directory
    is one message before any worker starts, not a traceback from inside a worker's ``from_pretrained``."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig  # heavy import

    local = Path(path)
    if local.is_dir():
        for name in JSON_FILES:
            if (local / name).is_file():
                try:
                    json.loads((local / name).read_bytes())
                except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
                    raise ValueError(f"{name} is not valid JSON ({err})") from None
        _check_weights(local)
    remote = {"trust_remote_code": trust_remote_code}
    loads = [("config.json", lambda: AutoConfig.from_pretrained(path, **remote))]
    if tokenizer:
        loads.append(("the tokenizer", lambda: AutoTokenizer.from_pretrained(path, **remote)))
    if (local / "generation_config.json").is_file():
        loads.append(("generation_config.json", lambda: GenerationConfig.from_pretrained(path)))
    for what, load in loads:
        try:
            load()
        except Exception as err:  # transformers raises OSError, ValueError, KeyError, ... for a bad file
            where = "" if local.is_dir() else " (not a local directory; looked up on the Hugging Face Hub)"
            raise ValueError(f"{what} does not load{where}: {type(err).__name__}: {err}") from None


def _check_weights(model_dir: Path) -> None:
    """Every weights file of ``model_dir`` (and every shard its ``*.index.json`` names) is there and whole."""
    files = set(model_dir.glob("*.safetensors")) | set(model_dir.glob("pytorch_model*.bin"))
    for index in model_dir.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_bytes())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index.name} is not a weights index (JSON with a weight_map): {err!r}") from None
        missing = sorted(name for name in shards if not (model_dir / name).is_file())
        if missing:
            raise ValueError(f"{index.name} names {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                             "missing: copy the whole model directory")
        files |= {model_dir / name for name in shards}
    if not files:
        raise ValueError(f"the directory holds no weights (allowed: {WEIGHTS_HINT})")
    from safetensors import safe_open

    for file in sorted(files):
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), framework="pt"):  # reads the header; checks the file covers it
                    pass
            except Exception as err:  # SafetensorError, OSError
                raise ValueError(f"{file.name} is damaged or truncated ({file.stat().st_size:,} bytes: {err}); copy "
                                 "or save the model again") from None
        elif _starts_with(file, b"PK") and not zipfile.is_zipfile(file):  # torch.save's zip format, cut off
            raise ValueError(f"{file.name} is damaged or truncated ({file.stat().st_size:,} bytes: no zip directory "
                             "at its end); copy or save the model again")


def _starts_with(file: Path, magic: bytes) -> bool:
    with file.open("rb") as f:
        return f.read(len(magic)) == magic


def check_models(cfg: Config) -> None:
    """``check_model_files`` for the policy (``actor_rollout_ref.model.path``, with its tokenizer) and a critic
    with its own ``critic.model.path``; ConfigError naming the key otherwise."""
    paths = [("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path, True)]
    if cfg.critic.model.path is not None and uses_critic(cfg):
        paths.append(("critic.model.path", cfg.critic.model.path, False))
    for key, path, with_tokenizer in paths:
        try:
            check_model_files(path, cfg.actor_rollout_ref.model.trust_remote_code, tokenizer=with_tokenizer)
        except ValueError as err:
            raise ConfigError(f"config key {key}={path!r} is invalid: {err} (allowed: a Hugging Face model directory "
                              "whose config.json, tokenizer and weights load)") from None


def check_positions(cfg: Config) -> None:
    """The longest sequence the lengths allow (``verl.config.max_sequence_length``) fits the policy's (and a critic's)
    ``max_position_embeddings``; else ConfigError naming the keys and the limit, for either engine (vLLM refuses such
    a request with a traceback; the HF engine would run past the trained positions silently)."""
    from transformers import AutoConfig  # heavy import

    d = cfg.data
    need = max_sequence_length(d)
    paths = [("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path)]
    if cfg.critic.model.path is not None and uses_critic(cfg):
        paths.append(("critic.model.path", cfg.critic.model.path))
    for key, path in paths:
        hf = AutoConfig.from_pretrained(path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
        limit = getattr(hf, "max_position_embeddings", None)
        if limit is not None and need > limit:
            raise ConfigError(
                f"the lengths allow sequences of {need} tokens, more than the model's max_position_embeddings={limit} "
                f"({key}={path!r}): min(data.max_prompt_length + data.max_response_length = "
                f"{d.max_prompt_length} + {d.max_response_length}, data.max_start_length + data.max_trajectory_length "
                f"= {d.max_start_length} + {d.max_trajectory_length}) must be at most {limit}; lower these keys "
                "(docs/design.md, Lengths)")


def init_single_process_group(device: torch.device) -> None:
    """A torch.distributed world of this process alone, unless one exists (FSDP2 needs a process group)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def shard_model(model: nn.Module, device: torch.device, offload: bool = False) -> None:
    """FSDP2: ``fully_shard`` every decoder layer, then the root (embeddings, head, tied weights);
    with ``offload`` the shards live in host memory (``CPUOffloadPolicy``)."""
    mesh = init_device_mesh(device.type, (world()[1],))
    policy = {"offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")} if offload else {}
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"{type(model).__name__} lists no decoder layer classes in _no_split_modules; "
                         "cannot shard it layer by layer")
    for layer in layers:
        fully_shard(layer, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)


def gather_full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """HF-named full weights as CPU tensors. Sharded models gather them (a collective: call on every
    rank); the full dict is returned on rank 0 and ``{}`` on other ranks."""
    if isinstance(model, FSDPModule):
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}


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


def response_outputs(model: nn.Module, batch: Batch, device: torch.device, dtype: torch.dtype, causal_lm: bool,
                     head: Callable[[Tensor, Tensor], Tensor | tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """Run ``model`` on a micro-batch and apply ``head`` to its outputs at the response columns.

    Args:
        batch: ``input_ids``, ``attention_mask``, ``position_ids`` [b, P+R], ``responses`` [b, R].
        causal_lm: the model takes ``logits_to_keep`` (the LM head then runs on the response only).
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
        if causal_lm:
            logits = model(**kwargs, logits_to_keep=r + 1).logits[:, :-1]  # [b, r, V]
        else:
            logits = model(**kwargs).logits[:, -r - 1:-1]  # [b, r, ...]
    out = head(logits, responses[:, :r].to(device))
    out = out if isinstance(out, tuple) else (out,)
    real = attention_mask[:, attention_mask.shape[1] - r:].to(device)  # [b, r], 1 = a real response token
    return tuple(torch.nn.functional.pad(t * real, (0, R - r)) for t in out)  # each [b, R]


def response_log_probs(model: nn.Module, batch: Batch, device: torch.device, dtype: torch.dtype,
                       with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [b, R] of ``responses`` under a causal LM, and the policy entropy [b, R] if asked.

    ``entropy_grad`` keeps the entropy in the autograd graph (an entropy bonus); otherwise it is
    computed without gradient (a metric). Both come from ``logprobs.logprobs_and_entropy`` over
    token chunks, so the model's logits are the only [b, r, V] tensor. Padding columns hold 0.
    """

    def head(logits: Tensor, labels: Tensor) -> tuple[Tensor, ...]:
        log_prob, entropy = logprobs_and_entropy(logits, labels, with_entropy, entropy_grad)  # [b, r] each
        return (log_prob,) if entropy is None else (log_prob, entropy)

    out = response_outputs(model, batch, device, dtype, causal_lm=True, head=head)
    return out[0], (out[1] if with_entropy else None)


# ----------------------------------------------------------------------------------------------
# Micro-batching
# ----------------------------------------------------------------------------------------------


def micro_batches(batch: Batch, rows: int, max_tokens: int | None = None) -> list[Batch]:
    """Split ``batch`` into micro-batches of ``rows`` rows, or by token budget when ``max_tokens`` is set.

    With a budget, consecutive rows are grouped while (rows in group) x (group width without
    all-padding columns) <= max_tokens (a row wider than the budget goes alone); every rank then
    splits its largest groups until all ranks have the same count.
    """
    if max_tokens is None:
        return batch.split(rows)
    attention_mask = batch["attention_mask"]  # [B, T]
    cols = torch.arange(attention_mask.shape[1])
    first = torch.where(attention_mask.bool(), cols, attention_mask.shape[1]).min(dim=1).values.tolist()  # [B]
    last = torch.where(attention_mask.bool(), cols, -1).max(dim=1).values.tolist()  # [B]
    groups: list[list[int]] = []
    for i in range(len(batch)):
        group = groups[-1] + [i] if groups else [i]
        width = max(last[j] for j in group) - min(first[j] for j in group) + 1
        if groups and len(group) * width <= max_tokens:
            groups[-1] = group
        else:
            groups.append([i])
    count = all_reduce_(torch.tensor([len(groups)]), dist.ReduceOp.MAX).item()
    while len(groups) < count:
        k = max(range(len(groups)), key=lambda g: len(groups[g]))
        big = groups.pop(k)
        groups[k:k] = [big[: len(big) // 2], big[len(big) // 2:]]
    return [batch.index(g) for g in groups]
