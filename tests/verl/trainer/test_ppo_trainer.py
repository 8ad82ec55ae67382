"""End-to-end trainer tests through the real entry point (tiny model, HF rollout, no mocks).

Guards against: a resumed run that differs from an uninterrupted one (dataloader position, RNG,
optimizer/scheduler state or sampling seeds not restored), a crash while saving leaving a
checkpoint that auto-resume would pick up, and config errors that do not name the key.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import (
    RAY_WORLD_2,
    TRAINED_STEPS,
    copy_run,
    final_weights,
    metrics,
    overrides,
    trained_run_args,
)
from verl.config import ConfigError, load_config
from verl.trainer.recipe import load_recipe

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`


@pytest.mark.parametrize("world", ["local", "ray"], ids=["local", "ray-world-2"])
def test_kill_and_resume_matches_uninterrupted_run(request, workspace, tmp_path, run_main, world):
    """A run stopped right after step 2's checkpoint and resumed with resume_mode=auto gives the metrics and final
    weights of a run that was never interrupted (guards the dataloader position, optimizer, scheduler, RNG and
    per-step sampling seeds in the checkpoint), in one process and with 2 Ray ranks (sharded checkpoints, an engine
    per rank). The uninterrupted run is the shared trained run; the stopped one is a copy of its directory as a
    SIGKILL after step 2's checkpoint leaves it (later checkpoints, metrics and model removed: a real SIGKILL at
    random moments is test_stability's kill -9 test)."""
    straight = request.getfixturevalue("trained_run" if world == "local" else "trained_run_ray")
    killed = copy_run(straight, tmp_path / "killed", 2)
    proc = run_main(trained_run_args(workspace, killed, TRAINED_STEPS, *([] if world == "local" else RAY_WORLD_2)))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert f"resuming from {killed / 'global_step_2'}" in out

    a, b = metrics(straight), metrics(killed)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3, 4]  # 0: the validation before step 1
    for ra, rb in zip(a[1:], b[1:], strict=True):
        for key in ("critic/score/mean", "actor/pg_loss", "critic/vf_loss"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-7), (ra["step"], key)
    wa, wb = final_weights(workspace, straight), final_weights(workspace, killed)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-5, atol=1e-6, msg=name)
    # The weights did move: the run trained something.
    from transformers import AutoModelForCausalLM
    w0 = AutoModelForCausalLM.from_pretrained(workspace / "model").state_dict()
    assert any(not torch.equal(w0[n], wa[n]) for n in wa)


def test_two_ranks_train_like_one(workspace, tmp_path, ray_address):
    """Guards against a 2-rank run that trains on other data or other rollouts than one rank (rows
    split or gathered out of order, engines not synced from the shards, losses normalised per rank):
    with greedy rollouts and one mini-batch, a step through 2 Ray ranks, each generating with its own
    engine, gives the metrics and weights of the same step in one process; no weights pass through
    the driver."""
    same_step = ["actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "critic.ppo_mini_batch_size=4", "trainer.save_freq=-1"]
    records = {}
    done = main_ppo_in_process(*overrides(workspace, tmp_path / "local", 2, *same_step))  # one process: this one
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records["local"] = metrics(tmp_path / "local")
    done = main_ppo_in_process(*overrides(workspace, tmp_path / "ray", 2, *same_step, *RAY_WORLD_2),
                               ray_address=ray_address)  # the driver: this process too
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records["ray"] = metrics(tmp_path / "ray")
    for one, two in zip(records["local"], records["ray"], strict=True):
        assert one["critic/score/mean"] == two["critic/score/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "actor/entropy"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), (one["step"], key)
        assert (one["perf/rollout_ranks"], two["perf/rollout_ranks"]) == (1, 2)
        sync_local, sync_ray = one["perf/sync_bytes_driver"], two["perf/sync_bytes_driver"]
        assert 0 < sync_local < 1024 and sync_ray == 2 * sync_local  # each rank's stats dict, never weights
        assert one["perf/sync_bytes_gathered"] == 0 < two["perf/sync_bytes_gathered"]
        for record in (one, two):  # torch alone takes more than 0.2 GiB; 0 = not read. The step's peak (the
            # high-water mark reset each step) lies between what stays resident and the process's lifetime peak
            assert 0.2 < record["perf/rss_gb"] <= record["perf/step_max_rss_gb"] <= record["perf/max_rss_gb"], record
        for record in (one, two):  # model FLOPs over measured peaks: a fraction, logged for every timed pass
            assert all(0 < record[f"perf/mfu/{phase}"] < 1 for phase in ("gen", "update_actor")), record
    wa, wb = final_weights(workspace, tmp_path / "local"), final_weights(workspace, tmp_path / "ray")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=3e-5, msg=name)


def test_token_budget_micro_batches_train_like_fixed_rows(workspace, tmp_path):
    """Guards against the token budget (actor.use_dynamic_bsz, the critic following it: the paper table's PPO rows)
    changing what PPO learns rather than how it is computed: with greedy rollouts and one mini-batch, two GAE steps
    whose actor and critic passes group the rows by length under 64 tokens give the losses, gradient norms and
    weights of the same steps in 1-row micro-batches."""
    same_step = ["actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "critic.ppo_mini_batch_size=4", "trainer.save_freq=-1", "algorithm.adv_estimator=gae"]
    budget = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64"]
    records = {}
    for name, keys in (("rows", same_step), ("tokens", [*same_step, *budget])):
        done = main_ppo_in_process(*overrides(workspace, tmp_path / name, 2, *keys))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        records[name] = metrics(tmp_path / name)
    for one, two in zip(records["rows"], records["tokens"], strict=True):
        assert "timing/update_critic" in one and "timing/update_critic" in two
        assert one["critic/score/mean"] == two["critic/score/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "critic/values/mean"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), (one["step"], key)
    wa, wb = final_weights(workspace, tmp_path / "rows"), final_weights(workspace, tmp_path / "tokens")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=3e-5, msg=name)


def test_an_on_policy_critic_trains_like_a_value_pass_then_its_update(workspace, tmp_path, monkeypatch):
    """Guards against the on-policy critic (one epoch over one mini-batch: its update's forward gives the values and
    its targets, config.computes_values_in_update) changing PPO: with greedy rollouts, two GAE steps give the losses,
    gradient norms, values and weights of the same steps with the separate value pass, which it leaves out."""
    from verl.trainer import ppo_trainer

    same_step = ["actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "critic.ppo_mini_batch_size=4", "trainer.save_freq=-1", "algorithm.adv_estimator=gae"]
    records = {}
    for name, fused in (("two_pass", False), ("fused", True)):
        monkeypatch.setattr(ppo_trainer, "computes_values_in_update", lambda cfg, fused=fused: fused)
        done = main_ppo_in_process(*overrides(workspace, tmp_path / name, 2, *same_step))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        records[name] = metrics(tmp_path / name)
    for one, two in zip(records["two_pass"], records["fused"], strict=True):
        assert "timing/values" in one and "timing/values" not in two  # the pass it saves
        assert one["critic/score/mean"] == two["critic/score/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "critic/values/mean",
                    "critic/returns/mean", "critic/advantages/mean"):
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), (one["step"], key)
    wa, wb = final_weights(workspace, tmp_path / "two_pass"), final_weights(workspace, tmp_path / "fused")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-6, atol=1e-6, msg=name)


def test_lora_grpo_run_end_to_end(workspace, tmp_path):
    """Guards against LoRA breaking the trainer's wiring: GRPO with a KL loss whose reference comes from
    the actor with adapters disabled (no reference worker), engines synced with merged weights, and
    an export that is a plain HF model of the base's names."""
    out = tmp_path / "lora"
    done = main_ppo_in_process(*overrides(workspace, out, 2, "actor_rollout_ref.model.lora_rank=4",
                                          "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
                                          "actor_rollout_ref.actor.use_kl_loss=true",
                                          "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                          "actor_rollout_ref.actor.optim.lr=0.01"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2] and all("actor/kl_loss" in r for r in records)
    # one epoch over one mini-batch: on-policy, so the old log-probs come from the update's own forward pass
    assert all("timing/old_log_prob" not in r and "timing/ref" in r for r in records)
    assert records[0]["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-9) and records[0]["actor/pg_clipfrac"] == 0
    # the estimate at the step's longest row, next to the step's measured peak (the process before the models
    # included)
    assert all(0.5 < r["perf/memory_estimate_gb"] / r["perf/step_max_rss_gb"] < 2 for r in records), records
    assert records[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-9)  # adapters start as a no-op
    assert records[1]["actor/kl_loss"] > 0  # ... and then the policy moved away from the base
    base, trained = final_weights(workspace, workspace / "model"), final_weights(workspace, out)
    assert trained.keys() == base.keys() and any(not torch.equal(base[n], trained[n]) for n in base)


def test_weights_through_the_driver_show_in_sync_bytes(workspace, tmp_path, monkeypatch):
    """Guards against perf/sync_bytes_driver reading ~0 while weights pass through the driver (it once counted
    only the tensors the sync call returned): a sync that also hands the weights to the driver as plain lists
    reads at least their bytes, and the step's driver traffic grows by as much."""
    from transformers import AutoModelForCausalLM

    from verl.trainer.cli import split_args
    from verl.trainer.main_ppo import build_trainer
    from verl.workers.actor_rollout import ActorRolloutWorker
    from verl.workers.engine_host import WeightSyncStats

    def one_step(out):
        files, args = split_args(overrides(workspace, out, 1, "trainer.save_freq=-1"))
        build_trainer(load_config(args, files)).fit()
        return metrics(out)[0]

    streamed = one_step(tmp_path / "streamed")
    assert 0 < streamed["perf/sync_bytes_driver"] < 1024
    assert streamed["perf/driver_bytes_to_workers"] > 0 and streamed["perf/driver_bytes_from_workers"] > 0

    @dataclasses.dataclass
    class WithWeights(WeightSyncStats):
        weights: dict = dataclasses.field(default_factory=dict)  # the full weights, handed to the driver

    sync = ActorRolloutWorker.sync_rollout_weights
    monkeypatch.setattr(ActorRolloutWorker, "sync_rollout_weights", lambda self: WithWeights(
        **vars(sync(self)), weights={name: t.tolist() for name, t in self.full_state_dict().items()}))
    via_driver = one_step(tmp_path / "via_driver")
    model = AutoModelForCausalLM.from_pretrained(workspace / "model")
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert via_driver["perf/sync_bytes_driver"] >= weight_bytes
    grown = via_driver["perf/driver_bytes_from_workers"] - streamed["perf/driver_bytes_from_workers"]
    assert grown >= weight_bytes


def test_half_written_checkpoint_is_not_resumed(workspace, tmp_path):
    """A crash while saving leaves global_step_N.tmp and an unchanged marker: auto-resume ignores it."""
    from verl.utils import checkpoint

    tmp = checkpoint.begin(tmp_path, 3)
    (tmp / "actor").mkdir()
    assert checkpoint.find_latest(tmp_path) is None
    checkpoint.commit(tmp_path, checkpoint.begin(tmp_path, 1), 1, {"step": 1}, "x: 1\n")
    assert checkpoint.find_latest(tmp_path) == tmp_path / "global_step_1"


@pytest.mark.parametrize("override, needle", [
    ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator"),
    ("trainer.backend=slurm", "trainer.backend"),
    ("data.train_batch_size=0", "data.train_batch_size"),
    ("actor_rollout_ref.actor.lossagg=1", "lossagg"),
    ("data.max_prompt_length=abc", "data.max_prompt_length"),
])
def test_bad_config_names_the_key(override, needle):
    """Config errors must name the offending key (and the allowed values for choices)."""
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config([override])


RAY_4 = ["trainer.backend=ray", "trainer.n_gpus_per_node=4"]


@pytest.mark.parametrize("bad, needle", [
    (["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     "tensor_model_parallel_size=2 is invalid: allowed a divisor of the 1 rank(s) that host engines "
     "(trainer.backend=local"),
    ([*RAY_4, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=3"],
     "tensor_model_parallel_size=3 is invalid: allowed a divisor of the 4 rank(s) that host engines"),
    ([*RAY_4, "trainer.rollout_ranks=4"], "trainer.rollout_ranks=4 is invalid: allowed 0 (engines on the training "
                                          "ranks) or, with trainer.backend=ray, 1 .. 3"),
    ([*RAY_4, "trainer.rollout_ranks=1", "actor_rollout_ref.rollout.name=vllm",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     "tensor_model_parallel_size=2 is invalid: allowed a divisor of the 1 rank(s) that host engines"),
    ([*RAY_4, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"], "1 with actor_rollout_ref.rollout.name=hf"),
    ([*RAY_4, "data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6"],
     "data.train_batch_size=6 is invalid: allowed a size whose rows"),
    ([*RAY_4, "actor_rollout_ref.actor.ppo_mini_batch_size=16", "critic.ppo_mini_batch_size=2"],
     "critic.ppo_mini_batch_size=2 is invalid: allowed a multiple of the world size 4"),
])
def test_ranks_and_tensor_parallel_groups_are_validated(bad, needle):
    """Guards against a world that the tensor-parallel groups or the batches do not tile, which would fail
    (or hang) only once the workers are up: the config names the key, the world size and what is allowed."""
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert needle in str(err.value)
    cfg = load_config([*RAY_4, "actor_rollout_ref.rollout.name=vllm",
                       "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2


def test_unknown_recipe_is_a_config_error(workspace, tmp_path, run_main):
    """Guards against a typo in the recipe key surfacing as a traceback after the workers started."""
    with pytest.raises(ConfigError, match="recipe='search_r1.no_such'"):
        load_recipe("search_r1.no_such")
    with pytest.raises(ConfigError, match="defines no build_recipe"):
        load_recipe("search_r1.prompts")
    proc = run_main(overrides(workspace, tmp_path, 1, "recipe=search_r1.no_such"))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "recipe='search_r1.no_such'" in out


def test_grpo_needs_groups():
    """GRPO with n=1 would silently give zero advantages; the config refuses it."""
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config(["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"])


def test_a_used_run_directory_is_resumed_or_refused_never_appended_to(workspace, trained_run, tmp_path):
    """Guards against a second run in the same directory appending its steps to the first run's metrics.jsonl
    (steps 1,2,1,2) and overwriting its hf_model/: the same command continues from the checkpoint; a different
    config, or a directory whose run left no checkpoint, is refused with exit 2 naming why. The first runs are
    copies of the shared trained run's directory as it stood after step 1 (with its checkpoint, and without, as
    trainer.save_freq=-1 leaves it); the launches run the trainer's main in this process (tests/entry_points.py)."""
    def refused(out, steps, *extra):
        done = main_ppo_in_process(*trained_run_args(workspace, out, steps, *extra))
        return done.returncode, done.stdout + done.stderr

    saved = copy_run(trained_run, tmp_path / "saved", 1)
    done = main_ppo_in_process(*trained_run_args(workspace, saved, 2))  # the same command, a larger budget: continues
    assert done.returncode == 0 and "continuing global_step_1" in done.stdout, done.stdout + done.stderr
    assert [r["step"] for r in metrics(saved)] == [0, 1, 2]
    code, text = refused(saved, 3, "actor_rollout_ref.actor.optim.lr=5e-3")
    assert code == 2 and "different config" in text and "actor_rollout_ref.actor.optim.lr" in text, text
    code, text = refused(saved, 3, "trainer.resume_mode=disable")
    assert code == 2 and "resume_mode=disable" in text, text
    assert [r["step"] for r in metrics(saved)] == [0, 1, 2]  # nothing appended by the refused runs

    unsaved = copy_run(trained_run, tmp_path / "unsaved", 1, checkpoints=False)
    code, text = refused(unsaved, 1, "trainer.save_freq=-1")
    assert code == 2 and "no checkpoint to continue from" in text, text
    assert [r["step"] for r in metrics(unsaved)] == [0, 1]
