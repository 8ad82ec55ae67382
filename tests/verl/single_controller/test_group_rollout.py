"""Generation on every actor rank: ``GroupRollout`` over ``ActorRolloutWorker`` ranks (real Ray, gloo, HF and vLLM).

Guards against: rows split over the ranks coming back out of order or regrouped; a rank that gets no
rows hanging or failing; duplicated prompts (GRPO groups) on different engines sampling the same
tokens because the engines share a seed; a group that generates differently from one engine; and a
weight sync that leaves any rank's engine with weights other than the actor's.
"""

from __future__ import annotations

import dataclasses

import pytest
import ray
from transformers import AutoModelForCausalLM

from tests.verl.workers.rollout.rollout_helpers import raw_logprobs
from tests.verl.workers.worker_test_utils import add_targets, random_batch
from verl.config import DEMO_CONFIG, load_config
from verl.single_controller import create_worker_group
from verl.single_controller.roles import ActorGroup
from verl.single_controller.rollout import GroupRollout, split_by_tokens
from verl.workers.actor_rollout import ActorRolloutWorker
from verl.workers.rollout import build_rollout
from verl.workers.rollout.base import SamplingParams

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]  # slow: Ray or FSDP processes

STOPS = ["</search>", "</answer>"]


def _config(model_dir, engine: str, backend: str, tp: int = 1):
    return load_config([
        f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.rollout.name={engine}",
        f"trainer.backend={backend}", f"trainer.n_gpus_per_node={2 if backend == 'ray' else 1}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}", "trainer.device=cpu",
        "data.max_prompt_length=128", "data.max_start_length=128", "data.max_response_length=128",
        "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.25", "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        # a large step, so that one update visibly changes what the policy generates
        "actor_rollout_ref.actor.optim.lr=0.05", "actor_rollout_ref.actor.grad_clip=null",
    ], [DEMO_CONFIG])


def _ids(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


def _ends(outputs) -> list[tuple[str, str | None]]:
    return [(o.finish_reason, o.stop_str) for o in outputs]


@pytest.fixture(scope="module")
def ray_cluster(ray_address):
    ray.init(address=ray_address)  # the session's Ray instance; ray.shutdown() only disconnects
    yield
    ray.shutdown()


def test_split_by_tokens_balances_and_keeps_every_row():
    """Guards against rows dropped or duplicated by the split, and long rows piled onto one engine:
    compared with a plain loop over the greedy rule (each row, longest first, to the least-loaded part)."""
    costs = [5, 90, 7, 7, 40, 33, 12, 90, 1, 64]
    for parts in (1, 2, 3, 4, 16):
        split = split_by_tokens(costs, parts)
        assert sorted(i for rows in split for i in rows) == list(range(len(costs)))
        loads, counts, expected = [0] * parts, [0] * parts, [[] for _ in range(parts)]
        for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
            best = 0
            for p in range(1, parts):
                if (loads[p], counts[p]) < (loads[best], counts[best]):
                    best = p
            expected[best].append(i)
            loads[best] += costs[i]
            counts[best] += 1
        assert split == [sorted(rows) for rows in expected]
        assert max(loads) - min(loads) <= max(costs)  # the greedy bound
    assert split_by_tokens([3], 2) == [[0], []]
    assert split_by_tokens([], 2) == [[], []]


@pytest.mark.parametrize("engine, tp", [("hf", 1), ("vllm", 1), ("vllm", 2)])
def test_two_ranks_generate_like_one_engine_and_sync_from_their_shards(engine, tp, model_dir, prompts, ray_cluster):
    """Greedy generation through a 2-rank group equals one engine's (all rows, 3 rows, 1 row: a rank
    with none), rows in order, n samples grouped; duplicated prompts on the two engines sample
    independently; after an actor update each rank streams its shards into its engine, after which
    every engine's log-probs are those of the actor's full weights and the group again generates
    like one engine holding those weights."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    reference = build_rollout(_config(model_dir, engine, "local"))  # one engine, in this process
    group = create_worker_group(ActorRolloutWorker, _config(model_dir, engine, "ray", tp), "ray", 2, total_steps=1)
    try:
        rollout = GroupRollout(group, tp)
        greedy = SamplingParams(max_tokens=24, temperature=0, stop=STOPS)
        for subset in (prompts, prompts[:3], prompts[-1:]):
            got, expected = rollout.generate(subset, greedy), reference.generate(subset, greedy)
            assert _ids(got) == _ids(expected) and _ends(got) == _ends(expected)
            engines_used = min(len(subset), 2 // tp)
            metrics = rollout.take_metrics()
            assert metrics["perf/rollout_ranks"] == float(engines_used * tp)
            assert 0.0 <= metrics["perf/rollout_idle_frac"] < 1.0

        sampled = SamplingParams(max_tokens=12, temperature=2.0, n=2, seed=7)
        duplicates = [prompts[4]] * 4  # rows 0, 2 go to engine 0 and rows 1, 3 to engine 1 (equal costs)
        first = rollout.generate(duplicates, sampled)
        assert len(first) == 8 and _ids(rollout.generate(duplicates, sampled)) == _ids(first)  # seeded: reproducible
        assert len({tuple(ids) for ids in _ids(first)}) > 4, "samples of duplicated prompts repeat across engines"

        batch = add_targets(random_batch(seed=40), seed=41)
        ActorGroup(group).update_actor(batch)
        stats = group.execute_all(ActorRolloutWorker.sync_rollout_weights)  # every rank's share
        full = group.execute_all(ActorRolloutWorker.full_state_dict)[0]  # the actor's weights after the update
        assert all(s.gathered_bytes > 0 and s.engine_bytes > s.gathered_bytes for s in stats)
        synced = AutoModelForCausalLM.from_pretrained(model_dir)  # the actor's updated weights, in one plain model
        synced.load_state_dict(full)
        scored = rollout.generate(prompts, dataclasses.replace(greedy, logprobs=True))  # both engines answer
        for prompt, out in zip(prompts, scored, strict=True):
            assert out.logprobs == pytest.approx(raw_logprobs(synced, prompt, out.token_ids), abs=1e-4)

        before = _ids(reference.generate(prompts, greedy))
        reference.sync_weights(full.items())
        after = reference.generate(prompts, greedy)
        assert _ids(after) != before, "the update should change what the policy generates"
        got = rollout.generate(prompts, greedy)
        assert _ids(got) == _ids(after) and _ends(got) == _ends(after)
    finally:
        group.shutdown()
