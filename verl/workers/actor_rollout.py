"""The actor with its rollout engine: one per rank, the engine colocated with the rank's FSDP shard.

Choices:

* **Hybrid engine** (verl's term): every actor rank builds its own engine (``build_rollout``: HF
  ``generate`` or vLLM) in its own process, next to its shard of the trained weights. vLLM runs
  inside the worker and joins the worker group's torch.distributed world (vLLM's
  ``external_launcher``), so ``tensor_model_parallel_size`` consecutive ranks form one engine. The
  driver spreads each ``generate`` call over the engines (``verl.single_controller.rollout``).
  Chosen over one engine process per rank driven by the worker because the weights then go from
  the shard to the engine inside one process (no pipe, no pickling, no driver), and because the same
  in-worker engine can later serve requests concurrently with training (async rollout) without a
  second process per device to place and keep alive.
* **Weight sync per rank, streamed.** For every parameter of the actor (a tied one gathered once) each
  rank casts its local FSDP2 shard to the engine dtype, all-gathers it (``DTensor.full_tensor``, a
  collective over the actor's ranks) and hands the full tensor to its engine before gathering the
  next: extra memory is one full parameter, a bf16 engine halves the bytes on the wire, and no
  weight passes through the driver. In a single process (no FSDP) the tensors go to the engine
  directly.
* **LoRA**: engines and the export receive merged weights under the base model's names
  (``lora.merge_lora``), computed from the gathered tensors as they stream.
* **Export**: rank 0 writes the Hugging Face model directory from the gathered full weights
  (a collective on every rank), built on the meta device so no second fp32 copy is allocated.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator

from torch import Tensor
from torch.distributed.tensor import DTensor

from verl.config import Config
from verl.workers.actor import ActorWorker
from verl.workers.engine_host import EngineHost, WeightSyncStats
from verl.workers.export import save_hf_model
from verl.workers.lora import merge_lora
from verl.workers.model_utils import DTYPES
from verl.workers.rollout import build_rollout
from verl.workers.weight_channel import WeightChannel

logger = logging.getLogger(__name__)


class ActorRolloutWorker(ActorWorker, EngineHost):
    """``ActorWorker`` plus this rank's rollout engine: ``generate``, ``sync_rollout_weights``, ``save_hf_model``."""

    def __init__(self, cfg: Config, total_steps: int):
        super().__init__(cfg, total_steps)
        self.engine_dtype = DTYPES[cfg.actor_rollout_ref.rollout.dtype]
        # disaggregated (trainer.rollout_ranks > 0): the engines live on the rollout ranks, fed by send_weights
        self.engine = build_rollout(cfg) if cfg.trainer.rollout_ranks == 0 else None
        self.channel: WeightChannel | None = None

    def sync_rollout_weights(self) -> WeightSyncStats:
        """Stream the actor's current weights into this rank's engine (call on every rank: collective); what this
        rank handed to its engine and gathered from the others."""
        start = time.perf_counter()
        stats = WeightSyncStats()
        self.engine.sync_weights(stats.counted(self._hf_weights(self._full_weights(stats))))
        stats.seconds = time.perf_counter() - start
        return stats

    def weight_channel_address(self) -> tuple[str, int]:
        """This node's address and a free port for the weight channel's store (asked of rank 0)."""
        import socket

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return socket.gethostbyname(socket.gethostname()), port

    def join_weight_channel(self, host: str, port: int, member: int, members: int) -> None:
        """Rank 0 only: member 0 of the channel to the rollout ranks (``WeightChannel``)."""
        self.channel = WeightChannel(host, port, member, members)

    def send_weights(self) -> WeightSyncStats:
        """Disaggregated sync (call on every training rank: the gather is a collective): rank 0 streams each full
        weight to the rollout ranks as it is gathered; the other ranks only take part in the gathers."""
        start = time.perf_counter()
        stats = WeightSyncStats()
        named = stats.counted(self._hf_weights(self._full_weights(stats)))
        if self.channel is not None:
            self.channel.send(named)
        else:
            for _ in named:  # the gathers, in the same order as rank 0's
                pass
        stats.seconds = time.perf_counter() - start
        return stats

    def _hf_weights(self, named: Iterator[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        """The model's own (name, tensor) pairs -> the HF model's: with LoRA, merged under base names."""
        return named if self.lora is None else merge_lora(named, self.lora.scaling)

    def _full_weights(self, stats: WeightSyncStats) -> Iterator[tuple[str, Tensor]]:
        """(name, full tensor in the engine dtype), one parameter at a time.

        A tied weight (one parameter under several names, e.g. embeddings and LM head) is gathered
        once and given under every name: vLLM's CPU kernels keep a processed copy per layer, so each
        name must arrive.
        """
        named = self.model.state_dict(keep_vars=True)
        names_per_tensor = Counter(id(t) for t in named.values())
        tied: dict[int, Tensor] = {}
        for name, tensor in named.items():
            if id(tensor) in tied:
                yield name, tied[id(tensor)]
                continue
            if isinstance(tensor, DTensor):
                local = tensor.detach().to(self.engine_dtype)
                shard_bytes = local.to_local().numel() * local.element_size()
                full = local.full_tensor()  # a new tensor, gathered from every rank's shard
                stats.gathered_bytes += full.numel() * full.element_size() - shard_bytes
            else:  # one process: the parameter itself (a view when the dtypes agree; engines copy from it)
                full = tensor.detach().to(self.engine_dtype)
            if names_per_tensor[id(tensor)] > 1:
                tied[id(tensor)] = full
            yield name, full

    def save_hf_model(self, out: str) -> None:
        """Write the actor as a Hugging Face model directory (``export.save_hf_model``). Call on every rank: gathering
        the weights is a collective."""
        model_cfg = self.cfg.actor_rollout_ref.model
        save_hf_model(self.model, self.lora, model_cfg.path, model_cfg.trust_remote_code, out)
