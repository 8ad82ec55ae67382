"""The single-controller PPO/GRPO loop.

``fit()`` runs, per step: generate (the recipe's generation function, e.g. the search agent, on the
rollout engines of all actor ranks) -> reward (the recipe's score function) -> old log-probs ->
reference log-probs -> values -> advantages -> critic update -> actor update -> weight sync into
every rank's engine -> validation / checkpoint / metrics. The driver holds the data and runs the
recipe's loop; the actor (with its engine), critic and reference live in worker groups
(in-process or Ray actors, see ``verl.single_controller``), called through their typed proxies
(``roles.py``: ``self.actor.compute_log_prob(batch)``). The trainer imports no task: the config
key ``recipe`` names the module that provides generation, reward and metrics (``recipe.py``).

A step is read in seven files (docs/design.md, "One training step"): this one, ``pipeline.py`` (which batch when,
dynamic sampling), ``recipe.py``, ``reward.py`` (reward, overlong, advantages), ``roles.py`` (worker calls),
``step_metrics.py`` (the typed ``StepResult`` and ``StepTimings``: each phase returns its metrics and is timed
where it runs) and ``columns.py`` (the column table every phase reads and writes through; the recipe's batch is
checked at the seam, ``recipe.check_generated``). The driver's traffic is metered by the worker groups: each step
logs ``perf/driver_bytes_to_workers`` and ``perf/driver_bytes_from_workers`` (every call's arguments and results)
and ``perf/sync_bytes_driver`` (those of the weight sync alone).

Masks: ``loss_mask = response_mask * info_mask`` when ``actor.state_masking`` (else
``response_mask``) is computed once, right after generation, and is the only mask the reward
placement, advantages, losses and token metrics use. Right after the reward, ``algorithm.overlong``
may zero it on the rows the length budget cut, or add a length penalty to the reward (``reward.apply_overlong``).

Stability (docs/design.md, "Faults and what the trainer does"): every step logs the rollout/trainer
mismatch over the policy tokens (``rollout/*``, from the engines' log-probs); a NaN/Inf advantage skips the
step's updates (a NaN/Inf loss or gradient norm skips an optimiser step in the workers), and ``health.HealthMonitor``
stops the run after ``trainer.max_skipped_updates`` such steps in a row and raises the health alarms (collapse,
reward hacking; ``alarms.py``), which stop the run after saving when ``trainer.stop_on`` names them; when the
recipe's environment stays down (``EnvironmentUnavailable``) the run saves the last finished step and stops.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import torch
from omegaconf import OmegaConf
from tqdm import tqdm
from transformers import AutoTokenizer

from verl.algorithms import core_algos
from verl.config import (
    Config,
    check_paths,
    computes_values_in_update,
    recomputes_old_log_probs,
    steering_keys,
    to_yaml,
    uses_critic,
    uses_lora,
    uses_reference,
    world_size,
)
from verl.protocol import Batch
from verl.single_controller import WorkerGroup, create_worker_group
from verl.single_controller.base import Traffic
from verl.single_controller.roles import (
    ActorGroup,
    CriticGroup,
    RefGroup,
    RolloutRanks,
    open_weight_channel,
    sync_engines,
)
from verl.single_controller.rollout import GroupRollout
from verl.tools import run_tool_specs
from verl.trainer import columns, step_metrics
from verl.trainer.health import HealthMonitor, TrainingStopped
from verl.trainer.pipeline import Generated, InlineRollout, PipelinedRollout, bound_staleness, fill_batch, round_seed
from verl.trainer.recipe import EnvironmentUnavailable, RecipeBuilder, check_generated, expected_row_lengths
from verl.trainer.reward import (
    RewardManager,
    apply_overlong,
    compute_advantages,
    load_custom_score_fn,
    token_rewards,
)
from verl.trainer.step_metrics import StepResult, StepTimings, timed
from verl.utils import checkpoint, run_dir
from verl.utils.dataset import PromptDataset, StatefulLoader
from verl.utils.plots import plot_curves
from verl.utils.rollout_log import TrajectoryLog
from verl.utils.tokenizer import pad_token_id
from verl.utils.tracking import Tracker, read_metrics
from verl.workers.actor_rollout import ActorRolloutWorker
from verl.workers.critic import CriticWorker
from verl.workers.flops import MfuMeter
from verl.workers.memory import MemoryMeter
from verl.workers.model_files import check_models, check_positions
from verl.workers.reference import RefWorker
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout_worker import RolloutWorker

logger = logging.getLogger(__name__)


class PPOTrainer:
    def __init__(self, cfg: Config, build_recipe: RecipeBuilder):
        self.cfg = cfg
        check_paths(cfg)
        check_models(cfg)
        check_positions(cfg)
        self.out_dir = Path(cfg.trainer.default_local_dir)
        self.health = HealthMonitor.for_run(cfg, self.out_dir)  # checks trainer.stop_on before anything is written
        config_yaml = to_yaml(cfg)
        # checks only: nothing of the run directory is written until every start-up check has passed (run_dir)
        run_dir.claim(self.out_dir, config_yaml, cfg.trainer.resume_mode, cfg.trainer.val_only, steering_keys(cfg),
                      to_yaml(type(cfg)()))
        self.resume_from = run_dir.resume_checkpoint(self.out_dir, cfg.trainer.resume_mode,
                                                     ["actor"] + (["critic"] if uses_critic(cfg) else []))
        model = cfg.actor_rollout_ref.model
        self.tokenizer = AutoTokenizer.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
        data = cfg.data
        tools = [spec.schema for spec in run_tool_specs(cfg) or []]  # shown in the prompts (a format with tools)
        self.train_set = PromptDataset(data.train_files, self.tokenizer, data.max_prompt_length, data.prompt_key,
                                       data.train_max_samples, sample_seed=data.seed, tools=tools)
        self.val_set = PromptDataset(data.val_files, self.tokenizer, data.max_prompt_length, data.prompt_key,
                                     data.val_max_samples, tools=tools)
        self.loader = StatefulLoader(self.train_set, data.train_batch_size, data.shuffle, data.seed)
        per_epoch = self.loader.batches_per_epoch()
        self.total_steps = cfg.trainer.total_training_steps or per_epoch * cfg.trainer.total_epochs
        self.step = 0
        self.initial_validation: dict[str, float] = {}  # validation before the first step of this run
        self.last_validation: dict[str, float] = {}
        self.already_complete = False  # fit() found every step of the run done (a rerun of a finished run)
        kl = cfg.algorithm.kl_ctrl
        self.kl_ctrl = core_algos.get_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)
        self.memory = MemoryMeter(cfg)  # the estimate now (the data's lengths, then the bound) and each step's
        self.memory.report(expected_row_lengths(cfg, self.tokenizer, self.train_set))
        self._build_workers()
        self.mfu = MfuMeter(cfg, self.memory.counted[2], self.actor.peak_flops)  # perf/mfu/*
        engines = self.actor.group if self.rollout_ranks is None else self.rollout_ranks.group
        self.rollout = GroupRollout(engines, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
        custom = cfg.custom_reward_function
        custom_score = load_custom_score_fn(custom.path, custom.name) if custom.path else None
        self.recipe = build_recipe(cfg, self.tokenizer, self.rollout)  # the last start-up check (e.g. its service)
        if not cfg.trainer.val_only:
            run_dir.record_config(self.out_dir, config_yaml)
        self.reward = RewardManager(self.tokenizer, custom_score or self.recipe.score, self.recipe.reward_details,
                                    custom=bool(custom.path))
        # a sample of every step's trajectories and of every validation's generations (rollout_log)
        self.trajectories = TrajectoryLog(cfg.trainer, self.out_dir, self.tokenizer, self.recipe.trajectory_fields)
        self.tracker = Tracker(cfg.trainer.logger, self.out_dir, cfg.trainer.project_name,
                               cfg.trainer.experiment_name, OmegaConf.to_container(OmegaConf.structured(cfg)))
        self._trained_step = 0  # the last step whose updates ran (an outage before them rewinds the step)
        self.loader_state = self.loader.state_dict()  # after the last trained batch (what a checkpoint stores)

    def _build_workers(self) -> None:
        """Actor (with a rollout engine on every rank, unless trainer.rollout_ranks puts the engines on ranks of their
        own), reference and critic groups of world_size ranks, each behind its typed proxy
        (``verl.single_controller.roles``)."""
        world, t = world_size(self.cfg), self.cfg.trainer
        placed = dict(pool_size=world + t.rollout_ranks) if t.rollout_ranks else {}
        make = lambda cls, **kw: create_worker_group(cls, self.cfg, t.backend, world,  # noqa: E731
                                                     total_steps=self.total_steps, **placed, **kw)
        # colocated engines generate on the actor ranks while they train when the rollout is pipelined
        self.actor = ActorGroup(make(ActorRolloutWorker,
                                     max_concurrency=2 if t.max_staleness > 0 and not t.rollout_ranks else 1))
        # The reference: its own frozen model, or under LoRA the actor with its adapters disabled. The reference and
        # the critic live in the actor's processes (Ray: one process per rank; single_controller/ray_group.py).
        self.ref: ActorGroup | RefGroup | None = None
        if uses_reference(self.cfg):
            self.ref = self.actor if uses_lora(self.cfg) else RefGroup(make(RefWorker, colocate_with=self.actor.group))
        self.critic = CriticGroup(make(CriticWorker, colocate_with=self.actor.group)) if uses_critic(self.cfg) \
            else None
        self.recompute_old = recomputes_old_log_probs(self.cfg)
        self.values_in_update = computes_values_in_update(self.cfg)
        if not self.recompute_old:
            logger.info("on-policy update (one PPO epoch, one mini-batch): the old-log-prob pass is skipped; the "
                        "update's own forward pass gives them")
        self.rollout_ranks: RolloutRanks | None = None  # the engines' own ranks, if any (else on the actor's)
        if t.rollout_ranks:
            self.rollout_ranks = RolloutRanks(create_worker_group(
                RolloutWorker, self.cfg, t.backend, t.rollout_ranks, total_steps=self.total_steps,
                pool_size=world + t.rollout_ranks, first_bundle=world))
            open_weight_channel(self.actor, self.rollout_ranks)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train for ``total_steps`` steps (continuing a checkpoint if one is resumed); returns the last validation."""
        self.resume()
        if self.step >= self.total_steps and not self.cfg.trainer.val_only:
            self.already_complete = True  # a rerun of a finished run: nothing to train, nothing to rewrite
            self.tracker.close()
            if not (self.out_dir / "hf_model" / "config.json").exists():  # killed after its last checkpoint
                self.finish()
            return self.last_validation
        if self.cfg.trainer.val_only or (self.cfg.trainer.val_before_train and self.step == 0):
            self.last_validation = self.initial_validation = self.validate()
            self.tracker.log(self.last_validation, step=self.step)
            if self.cfg.trainer.val_only:
                return self.last_validation
        rollout = self._start_rollout()  # which batch is generated when (trainer.max_staleness; pipeline.py)
        self.actor.peak_memory()  # each step's peak memory from here on, not the model loading's
        try:
            # A progress bar on a terminal; in a log file the tracker's line per step says the same.
            with tqdm(total=self.total_steps, initial=self.step, desc="training", unit="step",
                      disable=not sys.stderr.isatty()) as progress:
                while self.step < self.total_steps:
                    self.step += 1
                    try:
                        result = self.run_step(rollout)
                    except EnvironmentUnavailable as err:
                        self.stop_for_outage(err)
                    metrics = result.metrics
                    try:
                        metrics.update(self.health.observe(self.step, metrics, result.records))
                    except TrainingStopped as err:
                        self.stop_unhealthy(err)
                    self.tracker.log({**metrics, **result.timings.metrics(), **self._perf(result)}, step=self.step)
                    if self._due(self.cfg.trainer.save_freq):  # after the log: a kill in between redoes the step
                        self.save()
                    if self.health.stopping is not None:  # an alarm trainer.stop_on names fired
                        self.stop_for_alarm(self.health.stopping)
                    progress.update()
        finally:
            rollout.close()
        self.tracker.close()
        self.finish()
        return self.last_validation

    def finish(self) -> None:
        """A run's last outputs, from the final weights: the Hugging Face model directory and the curves."""
        self.export_hf(self.out_dir / "hf_model")
        plot_curves(self.tracker.jsonl_path, self.out_dir / "curves.png", self.cfg.trainer.experiment_name)

    def run_step(self, rollout: InlineRollout | PipelinedRollout) -> StepResult:
        """Take this step's generated batch, score and train on it, move the engines to this step's weights;
        then validate when due. Every phase returns its metrics and is timed here (``StepTimings``)."""
        start = time.perf_counter()
        self._take_traffic()  # count only this step's worker-group calls (not the previous checkpoint's)
        generated, wait_s = timed(rollout.take, self.step)
        train_start = time.perf_counter()
        generated, metrics = bound_staleness(rollout, generated, self.step - 1,
                                             lambda prompts: self._make_batch(prompts, self.step, None))
        metrics.update(generated.metrics)  # the recipe's, the engines' and dynamic sampling's
        # cut rows: masked out of the loss, or a length penalty on the reward (algorithm.overlong); before log-probs
        batch, overlong_metrics = apply_overlong(generated.batch, self.cfg.algorithm.overlong,
                                                 self.cfg.data.max_trajectory_length)
        metrics.update(overlong_metrics)
        trained = self.train_on(batch)
        metrics.update(trained.metrics)
        timings = trained.timings
        sync_metrics, timings.sync = timed(self._sync_step, rollout, trained.updated)
        metrics.update(sync_metrics)
        self._trained_step, self.loader_state = self.step, generated.loader_state
        records = self.trajectories.keep_trained(self.step, trained.batch)  # every row's; a sample kept on disk
        metrics["perf/overlap_s"] = rollout.overlap_s(train_start, time.perf_counter())
        if self._due(self.cfg.trainer.test_freq):
            validate_start = time.perf_counter()
            with rollout.quiet():  # the producer's batch in flight ends first: counted in timing/validate
                self.last_validation = self.validate()
            timings.validate = time.perf_counter() - validate_start
            metrics.update(self.last_validation)
        timings.wait_rollout, timings.gen = wait_s, generated.seconds  # gen: generation and reward, every round
        timings.step = time.perf_counter() - start
        return StepResult(trained.batch, metrics, trained.updated, timings, records)

    def _sync_step(self, rollout: InlineRollout | PipelinedRollout, updated: bool) -> dict[str, float]:
        """The engines move to this step's version: with its new weights when the actor was updated (unchanged
        otherwise: the same policy under the step's version), between the engine calls in flight."""
        with rollout.weights_update(), self.rollout.weights_update(version=self.step):
            return self.sync_weights() if updated else {}

    def _start_rollout(self) -> InlineRollout | PipelinedRollout:
        k = self.cfg.trainer.max_staleness
        if k == 0:
            return InlineRollout(self.loader, self._make_batch)
        return PipelinedRollout(self.loader, self._make_batch, first_step=self.step + 1, last_step=self.total_steps,
                                max_staleness=k, partial=self.cfg.actor_rollout_ref.rollout.partial,
                                version=lambda: self.rollout.version)

    def _make_batch(self, prompts: Batch, step: int, draw: Callable[[], Batch] | None) -> Generated:
        """Step ``step``'s generated, scored batch from ``prompts`` (and, with algorithm.filter_groups, further
        prompts from ``draw`` until the batch is full of groups whose scores differ; ``pipeline.fill_batch``). Runs
        in the rollout's producer thread when trainer.max_staleness >= 1."""
        params = self._train_sampling(step)

        def one_round(batch: Batch, round_index: int) -> Generated:
            made = self.generate(batch, replace(params, seed=round_seed(params.seed, round_index)))
            self.score(made.batch)
            return made

        fg = self.cfg.algorithm.filter_groups
        if not fg.enable:
            return one_round(prompts, 0)
        more = draw if draw is not None else lambda: prompts  # regenerating a dropped batch: the same prompts
        return fill_batch(prompts, more, one_round, groups=len(prompts), max_rounds=fg.max_num_gen_batches,
                          pad_id=pad_token_id(self.tokenizer))

    def train_on(self, batch: Batch) -> StepResult:
        """Log-probs, values, advantages and the updates for one generated, scored batch: the trained batch, the
        metrics, whether the actor was updated (its weights then go to the engines) and each phase's seconds.

        A NaN/Inf advantage or return skips both updates: nothing changes.
        """
        t = StepTimings()
        if self.recompute_old:  # else the update's own forward gives them (config.recomputes_old_log_probs)
            batch, t.old_log_prob = timed(columns.run, batch, "old_log_prob", self.actor.compute_log_prob)
        if self.ref is not None:
            batch, t.ref = timed(columns.run, batch, "ref", self.ref.compute_ref_log_prob)
        (batch, metrics), t.adv = timed(token_rewards, batch, self.cfg, self.kl_ctrl)
        if self.critic is not None and self.values_in_update:  # its update's forward gives the values
            (values, critic_metrics), t.update_critic = timed(self.critic.update_on_policy,
                                                              columns.require(batch, "values"))
            batch = columns.merge(batch, "values", values)
            metrics.update(critic_metrics)
        elif self.critic is not None:
            batch, t.values = timed(columns.run, batch, "values", self.critic.compute_values)
        batch, seconds = timed(compute_advantages, batch, self.cfg)
        t.adv += seconds
        metrics.update(step_metrics.mismatch_metrics(batch))
        if not self._finite_targets(batch):  # an on-policy critic skipped its own step on its non-finite loss
            actor = self.cfg.actor_rollout_ref.actor
            updates = actor.ppo_epochs * (len(batch) // actor.ppo_mini_batch_size)
            return StepResult(batch, {**metrics, **step_metrics.data_metrics(batch),
                                      "actor/skipped_updates": float(updates), "actor/nonfinite_advantages": 1.0},
                              updated=False, timings=t)
        if self.critic is not None and not self.values_in_update:
            critic_metrics, t.update_critic = timed(self.critic.update_critic, columns.require(batch, "update_critic"))
            metrics.update(critic_metrics)
        # verl's rule: the first critic_warmup - 1 steps train the critic only
        updated = self.step >= self.cfg.trainer.critic_warmup
        if updated:
            actor_metrics, t.update_actor = timed(self.actor.update_actor, columns.require(batch, "update_actor"))
            metrics.update(step_metrics.update_metrics(actor_metrics))
        metrics.update(self.actor.peak_memory())  # the largest rank's peak of this step
        return StepResult(batch, {**metrics, **step_metrics.data_metrics(batch)}, updated, t)

    # ------------------------------------------------------------------ phases
    def generate(self, batch: Batch, params: SamplingParams, n: int | None = None) -> Generated:
        """Repeat each prompt n times (consecutive rows share a uid), run the recipe's generation, add loss_mask;
        the generated batch with the generation's metrics (the recipe's ``meta["gen_metrics"]``, taken off the
        batch at the seam, and the engines')."""
        n = self.cfg.actor_rollout_ref.rollout.n if n is None else n
        self.rollout.take_metrics()  # reset: count only this generation's engines
        prompts = columns.require(batch.repeat(n), "generate")
        out = check_generated(self.recipe.generate(prompts, params), len(prompts), self.recipe.columns)
        metrics = {**out.meta.pop("gen_metrics", {}), **self.rollout.take_metrics()}
        # 1 = the token counts in every loss/advantage/metric; inserted tokens are excluded under state masking.
        loss_mask = out["response_mask"] * out["info_mask"] if self.cfg.actor_rollout_ref.actor.state_masking \
            else out["response_mask"]
        return Generated(columns.write(out, "loss_mask", loss_mask=loss_mask), batch, metrics)  # loss_mask [B, R]

    def score(self, batch: Batch) -> Batch:
        """The reward phase, in place (``RewardManager.score_batch``)."""
        return self.reward.score_batch(batch)

    def _finite_targets(self, batch: Batch) -> bool:
        """Whether the advantages and returns are finite on every counted token (logged when not)."""
        mask = batch["loss_mask"] != 0
        bad = [key for key in ("advantages", "returns") if not torch.isfinite(batch[key][mask]).all()]
        if bad:
            logger.warning("step %d: non-finite %s: the step's updates are skipped", self.step, " and ".join(bad))
        return not bad

    def stop_for_outage(self, err: EnvironmentUnavailable) -> NoReturn:
        """The recipe's environment stayed down: checkpoint the last finished step, raise ``TrainingStopped``.

        If the outage came before this step's updates the step is undone (the checkpoint's loader position is
        the last trained batch's), so the rerun trains it on real results; after them (during validation) the
        step is kept.
        """
        if self._trained_step < self.step:
            self.step -= 1
        saved = checkpoint.step_dir(self.out_dir, self.step)
        if self.step > 0 and not saved.exists():
            saved = self.save()
        where = f"saved checkpoint {saved}" if self.step > 0 else "nothing trained yet, no checkpoint"
        raise TrainingStopped(f"{err}\nstopped after step {self.step} ({where}); start the service and run the same "
                              f"command again to continue at step {self.step + 1}") from err

    def stop_unhealthy(self, err: TrainingStopped) -> NoReturn:
        """Too many skipped updates: save the weights as they are (every skipped update left them untouched, so they
        are the last finite ones) as this step's checkpoint, and raise ``TrainingStopped`` naming it."""
        raise TrainingStopped(f"{err}\nsaved the last finite weights as checkpoint {self._saved()}") from err

    def stop_for_alarm(self, why: str) -> NoReturn:
        """An alarm ``trainer.stop_on`` names fired: the step (logged) is saved and ``TrainingStopped`` names it."""
        raise TrainingStopped(f"{why}\nsaved checkpoint {self._saved()}; run the same command to continue at step "
                              f"{self.step + 1} (without the alarm in trainer.stop_on to train past it)")

    def _saved(self) -> Path:
        """This step's checkpoint, written now unless it exists."""
        saved = checkpoint.step_dir(self.out_dir, self.step)
        return saved if saved.exists() else self.save()

    def sync_weights(self) -> dict[str, float]:
        """The actor's new weights into every engine (``roles.sync_engines``: in memory, not via the driver).

        ``perf/sync_bytes_driver``: the payload of every worker-group call made while syncing, both ways, metered by
        the groups themselves (``single_controller.base.payload_bytes``), so weights routed through the driver by
        any call of this phase would show; today only rank 0's small ``WeightSyncStats`` comes back.
        ``perf/sync_bytes_engine`` / ``_gathered``: the bytes handed to the first engine / received by training
        rank 0 from other ranks in the gathers.
        """
        start = self._traffic_total()
        sent, received = sync_engines(self.actor, self.rollout_ranks)
        metrics = {"perf/sync_bytes_engine": float(received.engine_bytes),
                   "perf/sync_bytes_gathered": float(sent.gathered_bytes)}
        return {**metrics, "perf/sync_bytes_driver": float((self._traffic_total() - start).total)}

    def export_hf(self, out: Path) -> None:
        """Save the trained actor as a Hugging Face model directory (rank 0 writes it; for inference and evaluation)."""
        self.actor.save_hf_model(str(out))

    def validate(self) -> dict[str, float]:
        """Generate with val_kwargs over the validation set; mean score / extra metrics overall and per data_source;
        a sample of the generations kept (trainer.validation_data_*)."""
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        params_kw = {"temperature": vk.temperature, "top_p": vk.top_p, "top_k": vk.top_k}
        size = self.cfg.data.val_batch_size or len(self.val_set)
        per_row: dict[str, list] = defaultdict(list)
        kept, records = self.trajectories.validation_sample(len(self.val_set), vk.n), []
        for start in range(0, len(self.val_set), size):
            batch = self.val_set.batch(range(start, min(start + size, len(self.val_set))))
            params = SamplingParams(max_tokens=self.cfg.data.max_response_length, seed=self.cfg.trainer.seed,
                                    **params_kw)
            out = self.score(self.generate(batch, params, n=vk.n).batch)
            per_row["data_source"].extend(out["data_source"])
            per_row["score"].extend(out["score"])
            row_metrics = self.recipe.row_metrics
            extra = row_metrics(list(out["response_text"]), out) if row_metrics else {}
            for name, values in extra.items():
                per_row[name].extend(values)
            records += self.trajectories.records(out, self.step, "val",
                                                 [i for i, row in enumerate(out["index"]) if row in kept])
        self.trajectories.keep_validation(self.step, records)
        metrics = step_metrics.validation_metrics(per_row)
        logger.debug("validation at step %d: %s", self.step, {k: round(v, 4) for k, v in metrics.items()})
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        start = time.perf_counter()
        with checkpoint.writing(self.out_dir, self.step) as tmp:
            self.actor.save_checkpoint(str(tmp / "actor"))
            if self.critic is not None:
                self.critic.save_checkpoint(str(tmp / "critic"))
            # the loader's position after the last TRAINED batch: batches generated ahead are generated again on resume
            state = {"step": self.step, "loader": self.loader_state, "kl_coef": self.kl_ctrl.value}
            path = checkpoint.commit(self.out_dir, tmp, self.step, state, to_yaml(self.cfg))
        logger.info("saved checkpoint %s in %.1fs", path, time.perf_counter() - start)
        checkpoint.prune(self.out_dir, self.cfg.trainer.max_ckpt_to_keep, self.step)  # after: a failed save keeps all
        return path

    def resume(self) -> None:
        """Load the checkpoint named by trainer.resume_mode (found and verified at start-up, ``run_dir.claim``) and
        continue after its step."""
        path = self.resume_from
        if path is None:
            self.tracker.truncate_after(-1)  # a run that failed before its first step left at most a step-0 record
            return
        logger.info("resuming from %s", path)
        self.actor.load_checkpoint(str(path / "actor"))
        if self.critic is not None:
            self.critic.load_checkpoint(str(path / "critic"))
        state = checkpoint.load_trainer_state(path)
        self.step = state["step"]
        self.loader.load_state_dict(state["loader"])
        self.loader_state = self.loader.state_dict()
        self.kl_ctrl.value = state["kl_coef"]
        self.tracker.truncate_after(self.step)
        self.initial_validation, self.last_validation = step_metrics.logged_validations(self.tracker.jsonl_path)
        if self.tracker.jsonl_path.exists():  # the alarms' state (the run's starting entropy) from the steps logged
            self.health.restore(read_metrics(self.tracker.jsonl_path))
        with self.rollout.weights_update(version=self.step):
            self.sync_weights()

    # ------------------------------------------------------------------ helpers
    def _due(self, freq: int) -> bool:
        return freq > 0 and (self.step % freq == 0 or self.step == self.total_steps)

    def _train_sampling(self, step: int) -> SamplingParams:
        r = self.cfg.actor_rollout_ref.rollout
        # A per-step seed makes a resumed run sample exactly what the uninterrupted run sampled.
        return SamplingParams(max_tokens=self.cfg.data.max_response_length, temperature=r.temperature, top_p=r.top_p,
                              top_k=r.top_k, seed=self.cfg.trainer.seed * 100_003 + step, logprobs=True)

    def shutdown(self) -> None:
        """Release every worker group (Ray: their processes end now, not when this driver exits; a driver that goes
        on, a notebook or a test, keeps no workers or device memory of a finished run)."""
        for group in self._groups():
            group.shutdown()

    def _groups(self) -> list[WorkerGroup]:
        """The distinct worker groups (under LoRA the reference is the actor's group)."""
        roles = (self.actor, self.ref, self.critic, self.rollout_ranks)
        return list({id(r.group): r.group for r in roles if r is not None}.values())

    def _traffic_total(self) -> Traffic:
        return sum((g.traffic for g in self._groups()), Traffic())

    def _take_traffic(self) -> Traffic:
        return sum((g.take_traffic() for g in self._groups()), Traffic())

    def _perf(self, step: StepResult) -> dict[str, float]:
        """Throughput, the payload the step's worker-group calls moved through the driver (``traffic``), MFU and
        memory."""
        return {**step_metrics.perf_metrics(step.batch, step.timings, self._take_traffic()),
                **self.mfu.metrics(step.batch, step.timings.phases()), **self.memory.metrics(step.batch)}

