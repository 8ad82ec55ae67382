"""The trainer's typed handles on its worker groups: one proxy class per role, one method per call it makes.

``actor.compute_log_prob(batch)`` reads like a call on one worker and has the worker method's parameters and
return type; its body names the worker method itself (``ActorWorker.compute_log_prob``, a function, not a
string), so an editor's go-to-definition goes from the trainer's call to the proxy and from there to the code
every rank runs, and a type checker sees both. The proxy also says how the call is spread over the ranks
(``base.WorkerGroup``), which the worker method cannot know:

* a batch in, split: equal consecutive chunks, one per rank; the returned ``Batch``es concatenated in rank order,
  returned metrics rank 0's (the workers all-reduce them);
* every rank (collectives: checkpoints, the weight sync, the export, the peak memory reset), one result: rank 0's,
  or combined over the ranks where the method says so;
* rank 0 only (what one rank answers for all: its address, the device's peak FLOP/s).

A role's proxy holds its ``WorkerGroup`` (``group``: the trainer meters its traffic and shuts it down). The
engines' calls (``generate``, ``engine_step``, ...) go through ``rollout.GroupRollout``, the engines' own typed
handle, which spreads one generation over the engines instead of over the ranks. Two calls span roles: the weight
channel from the actor to the rollout ranks (``open_weight_channel``) and the weight sync (``sync_engines``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from verl.protocol import Batch
from verl.single_controller.base import WorkerGroup
from verl.workers.actor import ActorWorker
from verl.workers.actor_rollout import ActorRolloutWorker
from verl.workers.critic import CriticWorker
from verl.workers.engine_host import WeightSyncStats
from verl.workers.reference import RefWorker
from verl.workers.rollout_worker import RolloutWorker


class ActorGroup:
    """The actor's ranks (``ActorWorker``; ``ActorRolloutWorker`` with an engine beside each rank's shard)."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    def compute_log_prob(self, batch: Batch) -> Batch:
        """``old_log_probs`` and ``entropy`` [B, R] of the batch's responses, rows split over the ranks."""
        return self.group.execute_split(ActorWorker.compute_log_prob, batch)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``ref_log_prob`` [B, R] with the LoRA adapters disabled (the reference under LoRA), rows split."""
        return self.group.execute_split(ActorWorker.compute_ref_log_prob, batch)

    def update_actor(self, batch: Batch) -> dict[str, float]:
        """The PPO update on the batch, rows split; ``actor/*`` metrics over all ranks."""
        return self.group.execute_split(ActorWorker.update_actor, batch)

    def peak_memory(self) -> dict[str, float]:
        """Each memory metric's largest value over the ranks since the previous call (then reset on every rank)."""
        per_rank = self.group.execute_all(ActorWorker.peak_memory)
        return {key: max(rank[key] for rank in per_rank) for key in per_rank[0]}

    def peak_flops(self, dtypes: list[str]) -> dict[str, float]:
        """One device's dense matmul FLOP/s in each dtype, measured on rank 0."""
        return self.group.execute_ranks(ActorWorker.peak_flops, [0], dtypes)[0]

    def sync_rollout_weights(self) -> WeightSyncStats:
        """Every rank streams the current weights into its own engine (collective); rank 0's share."""
        return self.group.execute_all(ActorRolloutWorker.sync_rollout_weights)[0]

    def send_weights(self) -> WeightSyncStats:
        """Disaggregated sync, training side (collective): rank 0 sends each gathered weight; rank 0's share."""
        return self.group.execute_all(ActorRolloutWorker.send_weights)[0]

    def weight_channel_address(self) -> tuple[str, int]:
        """Rank 0's node address and a free port, for the weight channel to the rollout ranks."""
        return self.group.execute_ranks(ActorRolloutWorker.weight_channel_address, [0])[0]

    def join_weight_channel(self, host: str, port: int, members: int) -> None:
        """Rank 0 joins the weight channel as its member 0 (the sender)."""
        self.group.execute_ranks(ActorRolloutWorker.join_weight_channel, [0], host, port, 0, members)

    def save_checkpoint(self, path: str) -> None:
        """Every rank saves its shard, optimiser and scheduler under ``path``."""
        self.group.execute_all(ActorWorker.save_checkpoint, path)

    def load_checkpoint(self, path: str) -> None:
        """Every rank restores ``save_checkpoint``'s state."""
        self.group.execute_all(ActorWorker.load_checkpoint, path)

    def save_hf_model(self, out: str) -> None:
        """Rank 0 writes the Hugging Face model directory from the gathered weights (every rank gathers)."""
        self.group.execute_all(ActorRolloutWorker.save_hf_model, out)


class RefGroup:
    """The reference policy's ranks (``RefWorker``): a frozen copy of the initial weights."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``ref_log_prob`` [B, R] of the batch's responses under the initial weights, rows split over the ranks."""
        return self.group.execute_split(RefWorker.compute_ref_log_prob, batch)


class CriticGroup:
    """The critic's ranks (``CriticWorker``)."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    def compute_values(self, batch: Batch) -> Batch:
        """``values`` [B, R], rows split over the ranks."""
        return self.group.execute_split(CriticWorker.compute_values, batch)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """The value-loss update on the batch, rows split; ``critic/*`` metrics over all ranks."""
        return self.group.execute_split(CriticWorker.update_critic, batch)

    def update_on_policy(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """The on-policy update that measures the values itself, rows split: ``values`` [B, R] in batch order and
        the ``critic/*`` metrics over all ranks (``CriticWorker.update_on_policy``)."""
        out = self.group.execute_split(CriticWorker.update_on_policy, batch)
        return Batch(out.tensors), out.meta["metrics"]  # metrics: rank 0's (all-reduced: every rank's are equal)

    def save_checkpoint(self, path: str) -> None:
        """Every rank saves its shard, optimiser and scheduler under ``path``."""
        self.group.execute_all(CriticWorker.save_checkpoint, path)

    def load_checkpoint(self, path: str) -> None:
        """Every rank restores ``save_checkpoint``'s state."""
        self.group.execute_all(CriticWorker.load_checkpoint, path)


class RolloutRanks:
    """The ranks that only generate (``RolloutWorker``, ``trainer.rollout_ranks``): their engines are driven by
    ``GroupRollout``; the trainer feeds them weights."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    def join_weight_channel(self, host: str, port: int, members: int) -> None:
        """Rank r joins the weight channel as member 1 + r (member 0 is training rank 0, the sender)."""
        self.group.execute_each(RolloutWorker.join_weight_channel,
                                [(host, port, 1 + r, members) for r in range(self.group.world_size)])

    def receive_weights(self) -> WeightSyncStats:
        """Every rank streams what training rank 0 sends into its engine; rank 0's share."""
        return self.group.execute_all(RolloutWorker.receive_weights)[0]


def concurrently(*calls: Callable[[], object]) -> list:
    """Run the calls in threads at once (calls to different worker groups that meet in one collective); results in
    order; the first error is raised."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def open_weight_channel(actor: ActorGroup, rollout_ranks: RolloutRanks) -> None:
    """Connect training rank 0 (the sender, member 0) with every rollout rank (``WeightChannel``); both sides join
    at once."""
    host, port = actor.weight_channel_address()
    members = 1 + rollout_ranks.group.world_size
    concurrently(lambda: actor.join_weight_channel(host, port, members),
                 lambda: rollout_ranks.join_weight_channel(host, port, members))


def sync_engines(actor: ActorGroup, rollout_ranks: RolloutRanks | None) -> tuple[WeightSyncStats, WeightSyncStats]:
    """The actor's current weights into every engine, never through the driver: each actor rank streams them into
    its own engine, or (``rollout_ranks``) training rank 0 sends each as it is gathered and the rollout ranks stream
    them into theirs. Returns rank 0's (sending, receiving) shares (the same object when colocated)."""
    if rollout_ranks is None:
        stats = actor.sync_rollout_weights()
        return stats, stats
    sent, received = concurrently(actor.send_weights, rollout_ranks.receive_weights)
    return sent, received
