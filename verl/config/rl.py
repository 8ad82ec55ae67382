"""The RL trainer's config (``Config``), the quantities derived from several of its keys, and the rules between keys.

Everything about one key alone (type, choices, range, finiteness) is its declaration (``verl.config.sections``,
``verl.config.algorithm``; checked by ``verl.config.schema.check_settings``); a rule within one section is that
section's ``check`` method (``OptimConfig``, ``RunConfig``), shared with the SFT config. What is left are the rules
between keys, each a named function that ``check_trainer`` calls (``Config.check``; a recipe's config adds its own
rules and calls ``super().check()``), and ``check_trainer_paths``: the files a run reads exist, checked when a run
starts rather than when a config is built, so configs can be built and checked anywhere (``verl.config.paths``).
What an estimator needs (a critic, groups of rollout.n >= 2, ``algorithm.*`` keys) is asked of its registration
(``verl.algorithms.registry``), never listed here.

``Config`` and the functions over it share this module so that nothing in the package imports back up to it: the
loader (``verl.config.load``) imports it, and it imports only the declarations below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from verl.algorithms.registry import ADV_ESTIMATORS, POLICY_LOSSES, AdvEstimator, policy_loss_config
from verl.config.algorithm import AlgorithmConfig
from verl.config.compat import NO_EFFECT, NoEffect
from verl.config.paths import check_files, check_model_dir
from verl.config.schema import require, section, setting
from verl.config.sections import (
    ActorRolloutRefConfig,
    CriticConfig,
    CustomRewardConfig,
    DataConfig,
    TrainerConfig,
)
from verl.errors import ConfigError

RECIPES_GROUP = "verl.recipes"  # the entry-point group in which a package registers its recipe module


def registered_recipes(path: list[str] | None = None) -> list[str]:
    """The recipe modules the installed packages register (entry points of ``RECIPES_GROUP``, e.g. setup.py's
    ``"verl.recipes": ["NAME = package.recipe"]``), sorted. Every distribution's metadata is read, not only the first
    of each name on the path: a stale ``*.egg-info`` left in a checkout by an older build would otherwise hide the
    installed package's entry points. ``path``: the directories to look in instead of ``sys.path``."""
    from importlib.metadata import distributions

    found = distributions() if path is None else distributions(path=path)
    return sorted({ep.value for dist in found for ep in dist.entry_points if ep.group == RECIPES_GROUP})


def installed_recipe() -> str:
    """The default of the key ``recipe``: the one registered recipe module; "" when none or several are registered
    (then ``recipe`` must be given)."""
    found = registered_recipes()
    return found[0] if len(found) == 1 else ""


@dataclass
class Config:
    """The trainer's config: the recipe and plug-ins, then the trainer's sections."""

    # other trainers' keys that change nothing here, accepted with a notice (verl.config.compat)
    no_effect_keys: ClassVar[dict[str, NoEffect]] = NO_EFFECT

    recipe: str = setting(
        installed_recipe(), "Python module that plugs the task into the generic trainer: its build_recipe(cfg, "
        "tokenizer, generator) returns the generation loop, the reward and the validation metrics "
        "(verl.trainer.recipe.Recipe); its CONFIG_CLASS names the config's keys (this file documents the default's). "
        "Default: the recipe the installed packages register (entry point group verl.recipes).")
    plugins: list[str] = setting(
        [], "Python modules imported before the config is checked (and in every worker), e.g. [my_estimators]: an "
        "advantage estimator, policy loss, KL estimator or reward term they register is then a valid value of its "
        "key.")
    data: DataConfig = section(DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig)
    critic: CriticConfig = section(CriticConfig)
    algorithm: AlgorithmConfig = section(AlgorithmConfig)
    custom_reward_function: CustomRewardConfig = section(CustomRewardConfig)
    trainer: TrainerConfig = section(TrainerConfig)

    def check(self) -> None:
        """The rules between keys (``check_trainer``); a recipe's subclass adds its own after ``super().check()``."""
        check_trainer(self)

    def check_paths(self) -> None:
        """What a run needs when it starts (files exist; a subclass adds its own, e.g. a service's address)."""
        check_trainer_paths(self)


def check_paths(cfg: Config) -> None:
    """The files (and, per recipe, services) the run needs are named and exist; ConfigError naming the key.
    Checked when a run starts, not in ``validate``, so configs can be built and checked anywhere."""
    cfg.check_paths()


# ------------------------------------------------------------------ quantities derived from several keys
def adv_estimator(cfg: Config) -> AdvEstimator:
    """The registry entry of ``algorithm.adv_estimator``: the function and what it needs (critic, group ids,
    algorithm keys)."""
    import verl.algorithms  # noqa: F401 -- registers the built-ins (imports torch: on first use)

    return ADV_ESTIMATORS.get(cfg.algorithm.adv_estimator)


def uses_critic(cfg: Config) -> bool:
    """The critic exists when the advantage estimator reads critic values (``needs_critic`` in its registration:
    GAE)."""
    return adv_estimator(cfg).needs_critic


def computes_values_in_update(cfg: Config) -> bool:
    """Whether the critic's values come from its update's own forward pass instead of a separate value pass.

    When the critic's update is on-policy (one epoch over one mini-batch: a single optimiser step, so every
    micro-batch's forward runs on the weights the value pass would have used) and the estimator's returns are per
    row (``returns_per_row``: GAE's), each micro-batch's detached values are the values, its targets are computed
    from them on the spot, and the values go back to the trainer for the advantages: the same update, one forward
    pass of the critic fewer (the actor's on-policy shortcut, ``recomputes_old_log_probs``, for the critic).
    """
    estimator, c = adv_estimator(cfg), cfg.critic
    per_row = estimator.returns_per_row and not estimator.needs_groups and not estimator.needs_turns
    return estimator.needs_critic and per_row and c.ppo_epochs == 1 and \
        c.ppo_mini_batch_size >= trajectories_per_step(cfg)


def uses_reference(cfg: Config) -> bool:
    """Reference log-probs are needed when any KL term is on."""
    return cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def recomputes_old_log_probs(cfg: Config) -> bool:
    """Whether the step needs the separate old-log-prob pass.

    Not when the update is on-policy: one PPO epoch over one mini-batch makes a single optimiser step, so every
    micro-batch's forward pass runs on the weights the pass would have used and its detached log-probs are the old
    ones (ratio 1, as verl's on-policy shortcut). Still needed when the KL penalty in the reward reads them before
    the update (``algorithm.use_kl_in_reward``).
    """
    a = cfg.actor_rollout_ref.actor
    on_policy = a.ppo_epochs == 1 and a.ppo_mini_batch_size >= trajectories_per_step(cfg)
    return not on_policy or cfg.algorithm.use_kl_in_reward


def uses_lora(cfg: Config) -> bool:
    """The actor trains LoRA adapters; the reference is then the actor with its adapters disabled."""
    return cfg.actor_rollout_ref.model.lora_rank > 0


def trajectories_per_step(cfg: Config) -> int:
    """Rows of one training step: ``data.train_batch_size`` prompts x ``rollout.n`` samples each."""
    return cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n


def max_sequence_length(data: DataConfig) -> int:
    """The most tokens any sequence holds, in an engine request or a trained row (docs/design.md, "Lengths").

    A turn starts from a context of at most ``max_prompt_length`` and samples at most ``max_response_length``;
    a trained row is a prompt of at most ``max_start_length`` plus at most ``max_trajectory_length`` response tokens.
    """
    return min(data.max_prompt_length + data.max_response_length, data.max_start_length + data.max_trajectory_length)


def world_size(cfg: Config) -> int:
    """Ranks of every training group (actor, critic, reference): 1 for the local backend, nodes x workers per node
    for Ray, less the ranks that only generate (``trainer.rollout_ranks``)."""
    t = cfg.trainer
    return 1 if t.backend == "local" else t.nnodes * t.n_gpus_per_node - t.rollout_ranks


def rollout_world_size(cfg: Config) -> int:
    """Ranks that host engines: the rollout ranks when disaggregated, else every training rank."""
    return cfg.trainer.rollout_ranks or world_size(cfg)


# ------------------------------------------------------------------ rules between keys
def check_trainer(cfg: Config) -> None:
    """Every rule between keys of the trainer's sections (ConfigError naming the first key that breaks one)."""
    check_lengths(cfg)
    check_estimator(cfg)
    check_ranks(cfg)
    check_pipeline(cfg)
    check_overlong(cfg)
    check_lora(cfg)
    check_weight_copy(cfg)
    cfg.trainer.check("trainer")
    cfg.actor_rollout_ref.actor.optim.check("actor_rollout_ref.actor.optim")
    cfg.critic.optim.check("critic.optim")


def check_lengths(cfg: Config) -> None:
    """The prompt that starts a trajectory fits the context of a turn."""
    d = cfg.data
    require(d.max_start_length <= d.max_prompt_length, "data.max_start_length", d.max_start_length,
            f"at most data.max_prompt_length={d.max_prompt_length}")


def check_estimator(cfg: Config) -> None:
    """What the advantage estimator's registration declares it needs: groups (rollout.n >= 2; dynamic sampling
    drops whole groups) and ``algorithm.*`` keys that exist."""
    estimator, name, n = adv_estimator(cfg), cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    if estimator.needs_groups:
        require(n >= 2, "actor_rollout_ref.rollout.n", n, f">= 2 with algorithm.adv_estimator={name} (group baselines)")
    groups = [e for e in ADV_ESTIMATORS.names() if ADV_ESTIMATORS.get(e).needs_groups]
    fg = cfg.algorithm.filter_groups
    require(not fg.enable or estimator.needs_groups, "algorithm.filter_groups.enable", fg.enable,
            f"false with algorithm.adv_estimator={name}: dropping groups whose scores are all equal needs a group "
            f"estimator ({', '.join(groups)})")
    unknown = [arg for arg in estimator.config_args if not hasattr(cfg.algorithm, arg)]
    require(not unknown, "algorithm.adv_estimator", name,
            f"an estimator whose config_args are algorithm keys (it declares {unknown}, which are not)")
    actor = cfg.actor_rollout_ref.actor
    policy_loss_config(POLICY_LOSSES.get(actor.policy_loss.loss_mode), actor)  # its declared keys exist


def check_ranks(cfg: Config) -> None:
    """Rows split evenly over the ranks; tensor-parallel groups tile the ranks (DP = world / TP)."""
    t = cfg.trainer
    total = 1 if t.backend == "local" else t.nnodes * t.n_gpus_per_node
    require(t.rollout_ranks == 0 or (t.backend == "ray" and 0 < t.rollout_ranks < total), "trainer.rollout_ranks",
            t.rollout_ranks, f"0 (engines on the training ranks) or, with trainer.backend=ray, 1 .. {total - 1} (the "
            f"ranks of trainer.nnodes x trainer.n_gpus_per_node = {total} that only generate)")
    world, engines = world_size(cfg), rollout_world_size(cfg)
    rollout = cfg.actor_rollout_ref.rollout
    tp = rollout.tensor_model_parallel_size
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    require(engines % tp == 0, key, tp, f"a divisor of the {engines} rank(s) that host engines (trainer.backend="
            f"{t.backend}, trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node}, "
            f"trainer.rollout_ranks={t.rollout_ranks})")
    require(tp == 1 or rollout.name == "vllm", key, tp, "1 with actor_rollout_ref.rollout.name=hf "
            "(transformers generate has no tensor parallelism; use vllm)")
    rows = trajectories_per_step(cfg)
    require(rows % world == 0, "data.train_batch_size", cfg.data.train_batch_size,
            f"a size whose rows (x rollout.n = {rows}) split evenly over the {world} ranks")
    mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    require(rows % mini == 0, "actor_rollout_ref.actor.ppo_mini_batch_size", mini,
            f"a divisor of data.train_batch_size * rollout.n = {rows}")
    mini_batches = {"actor_rollout_ref.actor.ppo_mini_batch_size": mini}
    if uses_critic(cfg):
        mini_batches["critic.ppo_mini_batch_size"] = cfg.critic.ppo_mini_batch_size
    for key, value in mini_batches.items():
        require(value % world == 0, key, value, f"a multiple of the world size {world}")


def check_pipeline(cfg: Config) -> None:
    """trainer.max_staleness and what it needs (verl/trainer/pipeline.py)."""
    k, rollout = cfg.trainer.max_staleness, cfg.actor_rollout_ref.rollout
    if k > 0:
        require(cfg.actor_rollout_ref.actor.tis_cap is not None, "actor_rollout_ref.actor.tis_cap", None,
                f"a cap (e.g. 2) when trainer.max_staleness={k}: rows sampled by weights up to {k} updates old are "
                "corrected by truncated importance sampling against the engines' log-probs")
        require(rollout.tensor_model_parallel_size == 1 or cfg.trainer.rollout_ranks > 0,
                "actor_rollout_ref.rollout.tensor_model_parallel_size", rollout.tensor_model_parallel_size,
                "1 when trainer.max_staleness > 0 with engines on the training ranks (a tensor-parallel engine's "
                "collectives would interleave with training's); or put the engines on trainer.rollout_ranks")
    require(k > 0 or not rollout.partial, "actor_rollout_ref.rollout.partial", rollout.partial,
            "false when trainer.max_staleness=0 (there is no rollout in flight at a weight sync)")


def check_overlong(cfg: Config) -> None:
    """algorithm.overlong's buffer must fit in the budget it is a part of (verl/trainer/reward.py, apply_overlong)."""
    o, budget = cfg.algorithm.overlong, cfg.data.max_trajectory_length
    require(o.mode != "soft_penalty" or o.buffer_len <= budget, "algorithm.overlong.buffer_len", o.buffer_len,
            f"at most data.max_trajectory_length={budget} with algorithm.overlong.mode=soft_penalty (the penalty "
            "grows over the last buffer_len tokens of the budget)")


def check_lora(cfg: Config) -> None:
    """LoRA needs modules to put its adapters on."""
    model = cfg.actor_rollout_ref.model
    require(model.lora_rank == 0 or len(model.target_modules) > 0, "actor_rollout_ref.model.target_modules",
            model.target_modules, "a non-empty list of module names (e.g. [q_proj, v_proj]) when lora_rank > 0")


def check_weight_copy(cfg: Config) -> None:
    """``compute_weight_copy`` (the actor's, the critic's) needs a lower compute dtype and an unsharded model; the
    actor's also no LoRA (weight_copy.py)."""
    actor, critic = cfg.actor_rollout_ref.actor, cfg.critic
    copies = [("actor_rollout_ref.actor", actor.compute_weight_copy, actor.fsdp_config)]
    if uses_critic(cfg):
        copies.append(("critic", critic.compute_weight_copy, critic.model.fsdp_config))
    for owner, wanted, fsdp in copies:
        if not wanted:
            continue
        key = f"{owner}.compute_weight_copy"
        dtype_key = f"{owner}.{'model.' if owner == 'critic' else ''}fsdp_config.dtype"
        require(fsdp.dtype != "float32", key, True,
                f"false when {dtype_key}=float32 (the copy would be the weights themselves); set {dtype_key}=bfloat16 "
                "with it")
        require(owner == "critic" or not uses_lora(cfg), key, True,
                "false with LoRA (actor_rollout_ref.model.lora_rank > 0: only the adapters are trained, and the "
                "frozen base is cast as it is used)")
        require(world_size(cfg) == 1 and not fsdp.offload, key, True,
                f"false when the {owner.split('.')[-1]} is sharded with FSDP (several ranks, or fsdp_config offload): "
                "the copy is for one unsharded model")


# ------------------------------------------------------------------ the files a run reads
def check_trainer_paths(cfg: Config) -> None:
    """The files the run reads exist: model directories and parquet files (ConfigError naming the key)."""
    check_model_dir("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path)
    if cfg.critic.model.path is not None and uses_critic(cfg):
        check_model_dir("critic.model.path", cfg.critic.model.path)
    for key, value in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        if value is None:
            raise ConfigError(f"config key {key} is not set: name your parquet file(s) (comma-separated, in the "
                              "Search-R1 schema, e.g. from `python -m data_prep.qa_search`); the embedded demo sets it "
                              "with --config configs/demo.yaml")
        check_files(key, value, "comma-separated parquet files in the Search-R1 schema, e.g. from data_prep")
