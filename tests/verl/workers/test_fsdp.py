"""Data-parallel training with FSDP2 over gloo: 2 processes must make the single-process update."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.verl.workers.worker_test_utils import add_targets, make_config, random_batch
from verl.protocol import Batch
from verl.workers.actor import ActorWorker
from verl.workers.critic import CriticWorker
from verl.workers.reference import RefWorker
from verl.workers.shared_prefix import batch_prefix_length

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]  # slow: Ray or FSDP processes

# Token-budget micro-batches give the two ranks different local micro-batch counts (they must agree).
OVERRIDES = ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.entropy_coeff=0.01",
             "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.use_dynamic_bsz=true",
             "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40", "critic.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def gloo_rank(rank: int, world_size: int, port: int):
    """A spawned rank's body: one torch thread, in the gloo group on loopback, the group destroyed on the way out."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def train_one_step(cfg, batch) -> dict:
    """Log-probs (actor, sharded reference) and values, then one actor and one critic update."""
    actor, critic, ref = ActorWorker(cfg, total_steps=1), CriticWorker(cfg, total_steps=1), RefWorker(cfg, 1)
    log_probs = actor.compute_log_prob(batch)["old_log_probs"]
    ref_log_probs = ref.compute_ref_log_prob(batch)["ref_log_prob"]
    values = critic.compute_values(batch)["values"]
    metrics = {**actor.update_actor(batch), **critic.update_critic(batch)}
    critic_state = {name: t.full_tensor() if isinstance(t, dist.tensor.DTensor) else t.detach().clone()
                    for name, t in critic.model.state_dict().items()}
    return {"actor": actor, "log_probs": log_probs, "ref_log_probs": ref_log_probs, "values": values,
            "metrics": metrics, "actor_state": actor.full_state_dict(), "critic_state": critic_state}


def fsdp_rank(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """One spawned rank: join the gloo group, train on its half of the batch, save what rank 0 sees."""
    with gloo_rank(rank, world_size, port):
        batch = add_targets(random_batch(seed=20), seed=20).chunk(world_size)[rank]
        result = train_one_step(make_config(model_dir, *OVERRIDES), batch)
        result.pop("actor").save_checkpoint(os.path.join(out_dir, "actor_ckpt"))
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.timeout(300)
def test_two_process_fsdp_update_equals_single_process_update(tiny_model_dir, tmp_path):
    """Guards against wrong gradient scaling over ranks (FSDP averages, the loss must not), per-rank
    instead of global token counts, ranks disagreeing on micro-batch counts (a hang), metrics that
    are rank 0's instead of all ranks', and a sharded checkpoint that cannot be loaded elsewhere."""
    mp.spawn(fsdp_rank, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2)
    single = train_one_step(make_config(tiny_model_dir, *OVERRIDES), add_targets(random_batch(seed=20), seed=20))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]

    torch.testing.assert_close(torch.cat([r["log_probs"] for r in ranks]), single["log_probs"], atol=1e-6, rtol=0)
    for key in ("ref_log_probs", "values"):
        torch.testing.assert_close(torch.cat([r[key] for r in ranks]), single[key], atol=1e-6, rtol=0)
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    for key, value in single["metrics"].items():
        if key != "critic/vf_clipfrac":  # counts float ties of equal errors; see the report of this module
            assert ranks[0]["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert ranks[1]["actor_state"] == {}  # the full state is gathered on rank 0 only
    for role in ("actor_state", "critic_state"):
        assert ranks[0][role].keys() == single[role].keys()
        for name, value in single[role].items():
            torch.testing.assert_close(ranks[0][role][name], value, atol=3e-5, rtol=1e-5)

    resumed = ActorWorker(make_config(tiny_model_dir, *OVERRIDES), total_steps=1)
    resumed.load_checkpoint(str(tmp_path / "actor_ckpt"))  # written by 2 ranks, read by 1
    for name, value in resumed.full_state_dict().items():
        assert torch.equal(value, ranks[0]["actor_state"][name]), name


def nan_on_one_rank(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """One spawned rank: a NaN advantage on rank 1's rows only; then a clean update. Saves what each rank saw."""
    with gloo_rank(rank, world_size, port):
        batch = add_targets(random_batch(seed=21), seed=21).chunk(world_size)[rank]
        poisoned = Batch(dict(batch.tensors))
        poisoned.tensors["advantages"] = batch["advantages"].clone()
        if rank == 1:
            row, col = (batch["loss_mask"] == 1).nonzero()[0].tolist()
            poisoned.tensors["advantages"][row, col] = float("inf")
        actor = ActorWorker(make_config(model_dir), total_steps=2)
        before = actor.full_state_dict()
        skipped = actor.update_actor(poisoned)
        after_skip = actor.full_state_dict()
        clean = actor.update_actor(batch)
        torch.save({"before": before, "after_skip": after_skip, "skipped": skipped, "clean": clean},
                   os.path.join(out_dir, f"nan_rank{rank}.pt"))


@pytest.mark.timeout(300)
def test_non_finite_loss_on_one_rank_is_skipped_by_every_rank(tiny_model_dir, tmp_path):
    """Guards against ranks that disagree about skipping (one steps its optimiser, the other does not: the
    shards drift apart, or a collective hangs): an Inf advantage on rank 1 only makes both ranks skip, the
    weights stay bit for bit, and the next clean update runs on both."""
    mp.spawn(nan_on_one_rank, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"nan_rank{r}.pt", weights_only=False) for r in range(2)]
    for r in ranks:
        assert r["skipped"]["actor/skipped_updates"] == 1 and r["skipped"]["actor/nonfinite_loss"] >= 1
        assert r["clean"]["actor/skipped_updates"] == 0
    a, b = ranks[0]["skipped"], ranks[1]["skipped"]
    assert a.keys() == b.keys()  # all-reduced: the same on every rank (the losses are Inf/NaN, hence equal_nan)
    torch.testing.assert_close(torch.tensor(list(a.values())), torch.tensor(list(b.values())), equal_nan=True)
    for name, value in ranks[0]["before"].items():
        assert torch.equal(ranks[0]["after_skip"][name], value), name


def prefix_on_both_ranks(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """One spawned rank: micro-batches whose rows share their prompt, a log-prob pass and an update. Saves the
    log-probs, the metrics and the prefix each micro-batch would run once."""
    from tests.verl.workers.test_prefix_sharing import MICRO, grouped_batch

    with gloo_rank(rank, world_size, port):
        batch = add_targets(grouped_batch(seed=4 + rank), seed=22)
        actor = ActorWorker(make_config(model_dir, *MICRO), total_steps=1)
        alone = batch_prefix_length(batch.index([0, 1, 2, 3]))
        shared = [actor.prefix_sharing.prefix(batch.index(list(range(i, i + 4)))) for i in (0, 4)]
        log_probs = actor.compute_log_prob(batch)["old_log_probs"]
        metrics = actor.update_actor(batch)
        torch.save({"alone": alone, "shared": shared, "log_probs": log_probs, "metrics": metrics},
                   os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.timeout(300)
def test_a_sharded_model_runs_every_prompt_in_full(tiny_model_dir, tmp_path):
    """Guards against the shared-prefix forward under FSDP2: it frees the gathered weights after each forward call,
    so a backward through the prefix's call and the rows' call fails (every Ray two-rank run did). A sharded actor
    computes every row in full, with the log-probs a single process computes."""
    from tests.verl.workers.test_prefix_sharing import MICRO, grouped_batch

    mp.spawn(prefix_on_both_ranks, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert all(r["alone"] >= 12 and r["shared"] == [0, 0] for r in ranks)
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    single = ActorWorker(make_config(tiny_model_dir, *MICRO), total_steps=1)
    for rank in range(2):
        torch.testing.assert_close(ranks[rank]["log_probs"],
                                   single.compute_log_prob(grouped_batch(seed=4 + rank))["old_log_probs"],
                                   atol=1e-5, rtol=1e-5)
