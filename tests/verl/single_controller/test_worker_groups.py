"""Worker groups: the local and Ray backends make the same computation; splitting errors are clear."""

from __future__ import annotations

import pytest
import ray
import torch

from tests.verl.workers.worker_test_utils import add_targets, make_config, random_batch
from verl.protocol import Batch
from verl.single_controller import WorkerGroup, create_worker_group
from verl.single_controller.base import combine, split_for_ranks
from verl.single_controller.roles import ActorGroup, CriticGroup, RefGroup
from verl.workers.actor import ActorWorker
from verl.workers.critic import CriticWorker
from verl.workers.reference import RefWorker

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]  # slow: Ray or FSDP processes

OVERRIDES = ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.actor.ppo_epochs=2", "critic.ppo_micro_batch_size_per_gpu=2", "critic.ppo_epochs=2")


@pytest.fixture(scope="module")
def ray_groups(tiny_model_dir, ray_address):
    """An actor and a critic group of 2 workers each on the session's Ray instance, the critic in the actor's
    processes as the trainer places them, started once for the module (worker processes are the slow part)."""
    ray.init(address=ray_address)  # the session's Ray instance; ray.shutdown() only disconnects
    cfg = make_config(tiny_model_dir, *OVERRIDES)
    actor = create_worker_group(ActorWorker, cfg, "ray", 2, total_steps=1)
    groups = [actor, create_worker_group(CriticWorker, cfg, "ray", 2, total_steps=1, colocate_with=actor)]
    yield cfg, groups
    for group in groups:
        group.shutdown()
    ray.shutdown()


def run_step(actor_group: WorkerGroup, critic_group: WorkerGroup, batch: Batch) -> dict:
    """Log-probs, values and both updates through the worker groups' typed proxies, as the trainer calls them."""
    actor, critic = ActorGroup(actor_group), CriticGroup(critic_group)
    out = batch.union(actor.compute_log_prob(batch))
    out = add_targets(out.union(critic.compute_values(out)), seed=30)  # advantages, returns, ref
    metrics = {**critic.update_critic(out), **actor.update_actor(out)}
    return {"batch": out, "metrics": metrics, "state": actor_group.execute_all(ActorWorker.full_state_dict)[0]}


def test_ray_backend_with_two_cpu_workers_equals_local_backend(ray_groups):
    """Guards against the Ray group splitting or re-assembling rows out of order, workers that do not
    form one data-parallel group (each would train on half the data alone), and metrics taken from
    one rank: 2 Ray workers (FSDP2 over gloo) must reproduce the in-process worker."""
    cfg, (ray_actor, ray_critic) = ray_groups
    batch = random_batch(seed=30)
    local = run_step(create_worker_group(ActorWorker, cfg, "local", 1, total_steps=1),
                     create_worker_group(CriticWorker, cfg, "local", 1, total_steps=1), batch)
    distributed = run_step(ray_actor, ray_critic, batch)

    for key in ("old_log_probs", "entropy", "values"):
        torch.testing.assert_close(distributed["batch"][key], local["batch"][key], atol=1e-6, rtol=0)
    for key, value in local["metrics"].items():
        if key != "critic/vf_clipfrac":  # counts float ties of equal errors (core_algos), not stable to rounding
            assert distributed["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert distributed["state"].keys() == local["state"].keys()
    for name, value in local["state"].items():  # Adam turns rounding on near-zero gradients into ~1% of lr
        torch.testing.assert_close(distributed["state"][name], value, atol=3e-5, rtol=1e-5)


def test_ray_group_rejects_a_batch_that_does_not_split_evenly(ray_groups):
    """Guards against silently dropping or duplicating rows when the batch is not a multiple of the world size."""
    _, (_, ray_critic) = ray_groups
    with pytest.raises(ValueError, match="batch of 7 rows does not split into 2 equal parts"):
        CriticGroup(ray_critic).compute_values(random_batch(seed=31, rows=7))
    per_rank = ray_critic.execute_all(CriticWorker.compute_values, random_batch(seed=31, rows=2))
    assert len(per_rank) == 2 and torch.equal(per_rank[0]["values"], per_rank[1]["values"])


def test_colocated_roles_share_the_processes_and_refuse_what_cannot_share(ray_groups):
    """Guards against a colocated role starting processes of its own, and against a role built twice into the same
    processes or into processes of another size (refused before anything is built)."""
    cfg, (ray_actor, ray_critic) = ray_groups
    assert ray_critic.workers is ray_actor.workers and not ray_critic.owns_processes
    with pytest.raises(ValueError, match="already host a CriticWorker"):
        create_worker_group(CriticWorker, cfg, "ray", 2, total_steps=1, colocate_with=ray_actor)
    with pytest.raises(ValueError, match="1 ranks from bundle 0 against 2 from 0"):
        create_worker_group(RefWorker, cfg, "ray", 1, total_steps=1, colocate_with=ray_actor)


def test_local_group_and_factory_errors(tiny_model_dir):
    """Guards against a local group silently running one worker when several were asked for, and an
    unknown backend name falling through."""
    cfg = make_config(tiny_model_dir)
    with pytest.raises(ValueError, match="world_size=2"):
        create_worker_group(RefWorker, cfg, "local", 2, total_steps=1)
    with pytest.raises(ValueError, match="valid are local, ray"):
        create_worker_group(RefWorker, cfg, "mpi", 1, total_steps=1)
    group = create_worker_group(RefWorker, cfg, "local", 1, total_steps=1)
    batch = random_batch(seed=32, rows=3)
    out = RefGroup(group).compute_ref_log_prob(batch)
    assert isinstance(out, Batch) and out["ref_log_prob"].shape == batch["responses"].shape


def test_split_and_combine_keep_row_order():
    """Guards against results concatenated out of rank order and metrics averaged twice."""
    batch = Batch({"x": torch.arange(6)}, {"uid": list("abcdef")})
    chunks = split_for_ranks("m", batch, 3)
    assert [c["uid"].tolist() for c in chunks] == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert torch.equal(combine("m", chunks)["x"], torch.arange(6))
    assert combine("m", [{"loss": 1.0}, {"loss": 1.0}]) == {"loss": 1.0}
    with pytest.raises(TypeError, match="needs Batch or dict"):
        combine("m", [1, 2])
