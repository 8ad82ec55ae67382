"""Typed, validated configuration: the flat YAML + ``key=value`` overrides -> ``Config``.

Choices: the schema is a tree of dataclasses mirrored one-to-one by ``configs/ppo_trainer.yaml``
(the YAML holds the defaults and the comments; the dataclasses hold the types). OmegaConf merges
YAML and dotlist overrides in struct mode, so an unknown key fails naming the key; types are
checked by OmegaConf; choices and ranges are checked once here, in ``validate``, with errors that
name the key and the allowed values. The allowed algorithm names (advantage and KL estimators) and what
an estimator needs (a critic, groups of rollout.n >= 2) come from the registries of
``verl.algorithms.core_algos`` (``choices``, ``adv_estimator``), never from a list of their own here.
Library code receives the typed objects and never falls back to defaults of its own; the dataclass
defaults equal the YAML's (``tests/verl/test_config_defaults.py``).
"""

from __future__ import annotations

import importlib.resources
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from verl import config_checks
from verl.algorithms.registry import AdvEstimator
from verl.config_compat import CompatError, translate
from verl.errors import ConfigError

logger = logging.getLogger(__name__)

def _config_dir() -> Path:
    """``configs/`` of a checkout (editable installs included), else the copy an installed wheel ships as the
    package data ``verl.configs`` (setup.py maps it there)."""
    checkout = Path(__file__).resolve().parent.parent / "configs"
    if (checkout / "ppo_trainer.yaml").is_file():
        return checkout
    return Path(str(importlib.resources.files("verl.configs")))


CONFIG_DIR = _config_dir()
DEFAULT_CONFIG = CONFIG_DIR / "ppo_trainer.yaml"  # the defaults for real data (Search-R1's published lengths)
DEMO_CONFIG = CONFIG_DIR / "demo.yaml"  # the embedded demo's paths and small values, layered over the defaults


@dataclass
class DataConfig:
    train_files: str | None = None
    val_files: str | None = None
    prompt_key: str = "prompt"
    max_prompt_length: int = 4096  # the context a turn conditions on (prompt + response so far)
    max_response_length: int = 500  # tokens one turn may sample
    max_start_length: int = 2048  # the initial prompt, cut to its last tokens
    max_obs_length: int = 500  # one inserted <information> block
    max_trajectory_length: int = 4096  # the whole response: every turn's sampled + inserted tokens
    train_batch_size: int = 32
    val_batch_size: int | None = None
    shuffle: bool = True
    seed: int = 1
    train_max_samples: int | None = None
    val_max_samples: int | None = None


@dataclass
class ModelConfig:
    path: str | None = None
    enable_gradient_checkpointing: bool | None = None  # None = on for models above 1B parameters
    trust_remote_code: bool = False
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: float = 16.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                "up_proj", "down_proj"])


@dataclass
class OptimConfig:
    lr: float = 1e-6
    lr_warmup_steps_ratio: float = 0.0
    weight_decay: float = 0.0


@dataclass
class FSDPConfig:
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    dtype: str = "float32"  # training compute dtype (autocast); weights stay float32

    @property
    def offload(self) -> bool:
        """FSDP2's CPUOffloadPolicy moves parameters, gradients and optimiser state together: any one asks for all."""
        return self.param_offload or self.grad_offload or self.optimizer_offload


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 32
    ppo_micro_batch_size_per_gpu: int = 8
    ppo_epochs: int = 1
    grad_clip: float | None = 1.0
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float | None = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    state_masking: bool = True
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 8192
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    optim_state_dtype: str = "float32"
    tis_cap: float | None = None  # truncated importance sampling cap C; None = off


@dataclass
class ValKwargs:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1


@dataclass
class RolloutConfig:
    name: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.5
    cpu_kv_cache_gb: float = 1
    max_num_seqs: int = 256
    free_cache_engine: bool = False
    micro_batch_size: int = 64
    log_prob_micro_batch_size_per_gpu: int = 16
    tensor_model_parallel_size: int = 1
    mode: str = "sync"
    async_chunk_tokens: int = 0
    partial: bool = False
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)


@dataclass
class RefFSDPConfig:
    param_offload: bool = False
    dtype: str = "${actor_rollout_ref.actor.fsdp_config.dtype}"  # the frozen weights' dtype; default = the actor's


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 16
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)


@dataclass
class CriticModelConfig:
    path: str | None = None  # None = actor_rollout_ref.model.path
    enable_gradient_checkpointing: bool | None = None  # None = on for models above 1B parameters
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class CriticConfig:
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int = 32
    ppo_micro_batch_size_per_gpu: int = 8
    ppo_epochs: int = 1
    grad_clip: float | None = 1.0
    cliprange_value: float = 0.5
    value_loss_coef: float = 0.5


@dataclass
class KLControlConfig:
    type: str = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class FilterGroupsConfig:
    enable: bool = False
    metric: str = "score"
    max_num_gen_batches: int = 10


@dataclass
class OverlongConfig:
    mode: str = "none"  # none | mask | soft_penalty (verl/trainer/overlong.py)
    buffer_len: int = 100  # soft_penalty: tokens before data.max_response_length where the penalty starts
    penalty_factor: float = 1.0  # soft_penalty: the penalty at data.max_response_length


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    turn_reward_coef: float = 0.0
    turn_adv_coef: float = 1.0
    overlong: OverlongConfig = field(default_factory=OverlongConfig)


@dataclass
class RetrieverConfig:
    url: str | None = None  # required with do_search (no silent default: configs/demo.yaml sets the demo's)
    topk: int = 3
    timeout: float = 30
    outage_timeout_s: float = 300
    replica_timeout_s: float = 10
    replica_cooldown_s: float = 30
    coalesce_ms: float = 5.0
    coalesce_max: int = 512
    max_inflight: int = 4


@dataclass
class JudgeConfig:
    url: str | None = None
    model: str | None = None
    timeout_s: float = 60.0
    max_concurrency: int = 8


@dataclass
class RewardConfig:
    default_scorer: str = "em"
    format_score: float = 0.0
    normalize: str = "squad"
    terms: dict[str, float] | None = None
    turn_term: str | None = None
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass
class CustomRewardConfig:
    path: str | None = None
    name: str = "compute_score"


@dataclass
class TrainerConfig:
    backend: str = "local"
    ray_timeout_s: float = 30.0
    nnodes: int = 1
    n_gpus_per_node: int = 1
    total_epochs: int = 1
    total_training_steps: int | None = None
    critic_warmup: int = 0
    max_staleness: int = 0
    rollout_ranks: int = 0
    rollout_data_dir: str | None = None
    project_name: str = "search_r1"
    experiment_name: str | None = None  # None = <data>_<model>_<adv_estimator> (run_name)
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    test_freq: int = 10
    val_before_train: bool = True
    val_only: bool = False
    save_freq: int = -1
    resume_mode: str = "auto"
    default_local_dir: str = "outputs/${trainer.project_name}/${trainer.experiment_name}"
    seed: int = 1
    device: str = "auto"
    max_skipped_updates: int = 3
    max_skipped_share: float = 0.5
    alarm_entropy_below: float = 0.05
    alarm_clipfrac_above: float = 0.5


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    max_turns: int = 2
    do_search: bool = True
    recipe: str = "search_r1.recipe"
    reward: RewardConfig = field(default_factory=RewardConfig)
    custom_reward_function: CustomRewardConfig = field(default_factory=CustomRewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


DTYPE_NAMES = ("float32", "bfloat16", "float16")
# Allowed values of the string-choice keys, checked in ``validate``; the algorithm names are added by ``choices``.
CHOICES: dict[str, tuple[str, ...]] = {
    "actor_rollout_ref.rollout.name": ("vllm", "hf"),
    "actor_rollout_ref.rollout.mode": ("sync", "async"),
    "actor_rollout_ref.actor.optim_state_dtype": ("float32", "bfloat16"),
    "actor_rollout_ref.rollout.dtype": DTYPE_NAMES,
    "actor_rollout_ref.actor.fsdp_config.dtype": DTYPE_NAMES,
    "actor_rollout_ref.ref.fsdp_config.dtype": DTYPE_NAMES,
    "critic.model.fsdp_config.dtype": DTYPE_NAMES,
    "reward.default_scorer": ("em", "subem", "f1"),
    "reward.normalize": ("squad", "unicode"),
    "algorithm.filter_groups.metric": ("score",),
    "algorithm.overlong.mode": ("none", "mask", "soft_penalty"),  # verl/trainer/overlong.py
    "trainer.backend": ("local", "ray"),
    "trainer.device": ("auto", "cpu", "cuda"),
}
LOGGERS = ("console", "jsonl", "wandb", "tensorboard")


def _algos() -> ModuleType:
    """``verl.algorithms.core_algos``, imported on first use: it imports torch, and this module stays cheap to import.
    Importing it registers the built-in estimators in its registries (``verl.algorithms.registry``)."""
    from verl.algorithms import core_algos

    return core_algos


def _check_reward_terms(cfg: Config) -> None:
    """reward.terms / turn_term name terms that the recipe module registers (imported here only when they are set)."""
    r = cfg.reward
    if r.terms is None and r.turn_term is None:
        return
    import importlib

    from verl.algorithms.registry import REWARD_TERMS as TERMS

    try:
        importlib.import_module(cfg.recipe)  # registers the task's terms
    except ImportError:
        return  # the trainer reports an unknown recipe when it loads it

    for name, weight in (r.terms or {}).items():
        _require(name in TERMS, f"reward.terms.{name}", weight, f"a term among {', '.join(TERMS.names())}")
        _require(weight >= 0, f"reward.terms.{name}", weight, "a weight >= 0")
    _require(r.terms is None or len(r.terms) > 0, "reward.terms", r.terms,
             "null (Search-R1's reward) or at least one term")
    _require(r.turn_term is None or r.turn_term in TERMS, "reward.turn_term", r.turn_term,
             f"null or a term among {', '.join(TERMS.names())}")
    _require("judge" not in (r.terms or {}) or bool(r.judge.url), "reward.judge.url", r.judge.url,
             "the URL of an OpenAI-compatible server (e.g. vLLM's: http://HOST:PORT) when reward.terms has judge")


def _group_estimators() -> list[str]:
    registry = _algos().ADV_ESTIMATORS
    return [name for name in registry.names() if registry.get(name).needs_groups]


def choices() -> dict[str, tuple[str, ...]]:
    """Every string-choice key with its allowed values: ``CHOICES`` plus the names registered in ``core_algos``
    (advantage and KL estimators, policy losses, including any registered before the config is loaded) and the
    modes of the trainer-step modules that own them."""
    algos = _algos()
    kl_estimators = algos.KL_ESTIMATORS.names()
    return {**CHOICES,
            "algorithm.adv_estimator": algos.ADV_ESTIMATORS.names(),
            "algorithm.kl_penalty": kl_estimators,
            "actor_rollout_ref.actor.kl_loss_type": kl_estimators,
            "actor_rollout_ref.actor.policy_loss.loss_mode": algos.POLICY_LOSSES.names(),
            "actor_rollout_ref.actor.loss_agg_mode": algos.AGG_MODES,
            "algorithm.kl_ctrl.type": algos.KL_CONTROLLERS,
}


def adv_estimator(cfg: Config) -> AdvEstimator:
    """The registry entry of ``algorithm.adv_estimator``: the function and what it needs (critic, group ids,
    algorithm keys)."""
    return _algos().ADV_ESTIMATORS.get(cfg.algorithm.adv_estimator)


def trajectories_per_step(cfg: Config) -> int:
    """Rows of one training step: ``data.train_batch_size`` prompts x ``rollout.n`` samples each."""
    return cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n


def max_sequence_length(data: DataConfig) -> int:
    """The most tokens any sequence holds, in an engine request or a trained row (docs/design.md, "Lengths").

    A turn starts from a context of at most ``max_prompt_length`` and samples at most ``max_response_length``;
    a trained row is a prompt of at most ``max_start_length`` plus at most ``max_trajectory_length`` response tokens.
    """
    return min(data.max_prompt_length + data.max_response_length, data.max_start_length + data.max_trajectory_length)


def _get(cfg: Config, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _require(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key}={value!r} is invalid: allowed {allowed}")


def validate(cfg: Config) -> Config:
    """Check choices, ranges and cross-key rules; raise ConfigError naming the key."""
    config_checks.check_finite(cfg, ConfigError)
    for key, allowed in choices().items():
        value = _get(cfg, key)
        _require(value in allowed, key, value, "one of " + ", ".join(allowed))
    for name in cfg.trainer.logger:
        _require(name in LOGGERS, "trainer.logger", name, "a list of " + ", ".join(LOGGERS))
    positive = [
        "data.max_prompt_length", "data.max_response_length", "data.max_start_length",
        "data.max_obs_length", "data.max_trajectory_length", "data.train_batch_size",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_epochs",
        "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.micro_batch_size",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.val_kwargs.n", "critic.ppo_mini_batch_size", "critic.ppo_micro_batch_size_per_gpu",
        "critic.ppo_epochs", "retriever.topk", "trainer.max_skipped_updates", "trainer.nnodes",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "trainer.n_gpus_per_node", "trainer.total_epochs", "max_turns",
    ]
    for key in positive:
        value = _get(cfg, key)
        _require(value >= 1, key, value, "an integer >= 1")
    for key in ("algorithm.gamma", "algorithm.lam", "actor_rollout_ref.rollout.top_p"):
        value = _get(cfg, key)
        _require(0.0 <= value <= 1.0, key, value, "a number in [0, 1]")
    for key in ("actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.optim.lr", "critic.optim.lr"):
        value = _get(cfg, key)
        _require(value > 0, key, value, "a number > 0")
    for key in ("actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.val_kwargs.temperature"):
        value = _get(cfg, key)
        _require(value >= 0, key, value, "a number >= 0 (0 = greedy)")
    for key in ("actor_rollout_ref.rollout.top_k", "actor_rollout_ref.rollout.val_kwargs.top_k"):
        value = _get(cfg, key)
        _require(value == -1 or value >= 1, key, value, "-1 (off) or an integer >= 1")
    _require(0.0 < cfg.actor_rollout_ref.rollout.val_kwargs.top_p <= 1.0, "actor_rollout_ref.rollout.val_kwargs.top_p",
             cfg.actor_rollout_ref.rollout.val_kwargs.top_p, "a number in (0, 1]")
    for key in ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "critic.optim.lr_warmup_steps_ratio"):
        value = _get(cfg, key)
        _require(0.0 <= value <= 1.0, key, value, "a fraction of the run's steps in [0, 1]")
    steps = cfg.trainer.total_training_steps
    _require(steps is None or steps >= 1, "trainer.total_training_steps", steps,
             "null (trainer.total_epochs worth of steps) or an integer >= 1")
    for key in ("data.train_max_samples", "data.val_max_samples"):
        value = _get(cfg, key)
        _require(value is None or value >= 1, key, value, "null (all rows) or an integer >= 1")
    for key in ("algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.kl_loss_coef",
                "actor_rollout_ref.actor.entropy_coeff", "critic.value_loss_coef"):
        value = _get(cfg, key)
        _require(value >= 0, key, value, "a number >= 0")
    gpu = cfg.actor_rollout_ref.rollout.gpu_memory_utilization
    _require(0.0 < gpu <= 1.0, "actor_rollout_ref.rollout.gpu_memory_utilization", gpu, "a fraction in (0, 1]")
    if cfg.retriever.url is not None:
        config_checks.check_retriever_url(cfg.retriever.url, ConfigError)
    _require(cfg.trainer.critic_warmup >= 0, "trainer.critic_warmup", cfg.trainer.critic_warmup, "an integer >= 0")
    _check_pipeline(cfg)
    _check_overlong(cfg)
    for key, lowest in (("actor_rollout_ref.rollout.async_chunk_tokens", 0), ("retriever.coalesce_ms", 0),
                        ("retriever.coalesce_max", 1), ("retriever.max_inflight", 1)):
        value = _get(cfg, key)
        _require(value >= lowest, key, value, f"a number >= {lowest}")
    model = cfg.actor_rollout_ref.model
    _require(model.lora_rank >= 0, "actor_rollout_ref.model.lora_rank", model.lora_rank, "0 (off) or an integer >= 1")
    _require(model.lora_rank == 0 or len(model.target_modules) > 0, "actor_rollout_ref.model.target_modules",
             model.target_modules, "a non-empty list of module names (e.g. [q_proj, v_proj]) when lora_rank > 0")
    for key in ("retriever.timeout", "retriever.outage_timeout_s", "retriever.replica_timeout_s",
                "retriever.replica_cooldown_s"):
        value = _get(cfg, key)
        _require(value > 0, key, value, "a number of seconds > 0")
    _require(cfg.retriever.replica_timeout_s <= cfg.retriever.timeout, "retriever.replica_timeout_s",
             cfg.retriever.replica_timeout_s, f"at most retriever.timeout={cfg.retriever.timeout:g}")
    tis = cfg.actor_rollout_ref.actor.tis_cap
    _require(tis is None or tis >= 1.0, "actor_rollout_ref.actor.tis_cap", tis, "null (off) or a number >= 1")
    actor = cfg.actor_rollout_ref.actor
    _require(actor.clip_ratio_c is None or actor.clip_ratio_c > 1.0, "actor_rollout_ref.actor.clip_ratio_c",
             actor.clip_ratio_c, "null or a number > 1")
    _require(actor.clip_ratio_low is None or 0.0 < actor.clip_ratio_low < 1.0, "actor_rollout_ref.actor.clip_ratio_low",
             actor.clip_ratio_low, "null (= clip_ratio) or a number in (0, 1)")
    _require(actor.clip_ratio_high is None or actor.clip_ratio_high > 0.0, "actor_rollout_ref.actor.clip_ratio_high",
             actor.clip_ratio_high, "null (= clip_ratio) or a number > 0")
    _require(cfg.data.val_batch_size is None or cfg.data.val_batch_size >= 1, "data.val_batch_size",
             cfg.data.val_batch_size, "null or an integer >= 1")
    _require(cfg.data.max_start_length <= cfg.data.max_prompt_length, "data.max_start_length",
             cfg.data.max_start_length, f"at most data.max_prompt_length={cfg.data.max_prompt_length}")
    n, rows = cfg.actor_rollout_ref.rollout.n, trajectories_per_step(cfg)
    mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    _require(rows % mini == 0, "actor_rollout_ref.actor.ppo_mini_batch_size", mini,
             f"a divisor of data.train_batch_size * rollout.n = {rows}")
    estimator, name = adv_estimator(cfg), cfg.algorithm.adv_estimator
    if estimator.needs_groups:
        _require(n >= 2, "actor_rollout_ref.rollout.n", n,
                 f">= 2 with algorithm.adv_estimator={name} (group baselines)")
    _check_reward_terms(cfg)
    fg = cfg.algorithm.filter_groups
    _require(not fg.enable or estimator.needs_groups, "algorithm.filter_groups.enable", fg.enable,
             f"false with algorithm.adv_estimator={name}: dropping groups whose scores are all equal needs a group "
             f"estimator ({', '.join(_group_estimators())})")
    _require(fg.max_num_gen_batches >= 1, "algorithm.filter_groups.max_num_gen_batches", fg.max_num_gen_batches,
             "an integer >= 1 (generation rounds per step, the first included; verl's 0 = unbounded is not offered: "
             "a dataset whose groups all score alike would never fill a batch)")
    unknown = [arg for arg in estimator.config_args if not hasattr(cfg.algorithm, arg)]
    _require(not unknown, "algorithm.adv_estimator", name,
             f"an estimator whose config_args are algorithm keys (it declares {unknown}, which are not)")
    _validate_ranks(cfg)
    _require(cfg.trainer.resume_mode in ("auto", "disable") or Path(cfg.trainer.resume_mode).exists(),
             "trainer.resume_mode", cfg.trainer.resume_mode, "auto, disable or an existing checkpoint path")
    config_checks.check_ranges(cfg, ConfigError)
    return cfg


def _check_pipeline(cfg: Config) -> None:
    """trainer.max_staleness and what it needs (verl/trainer/pipeline.py)."""
    k, rollout = cfg.trainer.max_staleness, cfg.actor_rollout_ref.rollout
    _require(k >= 0, "trainer.max_staleness", k, "an integer >= 0 (0 = generate each batch after the previous update)")
    if k > 0:
        _require(cfg.actor_rollout_ref.actor.tis_cap is not None, "actor_rollout_ref.actor.tis_cap", None,
                 f"a cap (e.g. 2) when trainer.max_staleness={k}: rows sampled by weights up to {k} updates old are "
                 "corrected by truncated importance sampling against the engines' log-probs")
        _require(rollout.tensor_model_parallel_size == 1 or cfg.trainer.rollout_ranks > 0,
                 "actor_rollout_ref.rollout.tensor_model_parallel_size", rollout.tensor_model_parallel_size,
                 "1 when trainer.max_staleness > 0 with engines on the training ranks (a tensor-parallel engine's "
                 "collectives would interleave with training's); or put the engines on trainer.rollout_ranks")
    _require(k > 0 or not rollout.partial, "actor_rollout_ref.rollout.partial", rollout.partial,
             "false when trainer.max_staleness=0 (there is no rollout in flight at a weight sync)")


def _check_overlong(cfg: Config) -> None:
    """algorithm.overlong.* (verl/trainer/overlong.py); the buffer must fit in the budget it is a part of."""
    o, budget = cfg.algorithm.overlong, cfg.data.max_trajectory_length
    _require(o.penalty_factor >= 0, "algorithm.overlong.penalty_factor", o.penalty_factor, "a number >= 0")
    _require(o.buffer_len >= 1, "algorithm.overlong.buffer_len", o.buffer_len, "an integer >= 1 (tokens)")
    _require(o.mode != "soft_penalty" or o.buffer_len <= budget, "algorithm.overlong.buffer_len", o.buffer_len,
             f"at most data.max_trajectory_length={budget} with algorithm.overlong.mode=soft_penalty (the penalty "
             "grows over the last buffer_len tokens of the budget)")


def _check_model_dir(key: str, path: str | None) -> None:
    """A local model directory must exist and hold config.json; a missing path that looks like a hub id
    (``owner/name``) is left to transformers."""
    if path is None:
        raise ConfigError(f"config key {key} is not set: name the policy (a Hugging Face model directory with "
                          f"config.json, tokenizer and weights, e.g. {key}=/models/Qwen2.5-3B); the embedded demo "
                          "sets it with --config configs/demo.yaml (what `make demo` runs)")
    p = Path(path)
    hub_like = re.fullmatch(r"[\w.-]+/[\w.-]+", path) is not None and not path.startswith(".")
    if not p.exists() and not hub_like:
        raise ConfigError(f"config key {key}={path!r} is invalid: no such directory (allowed: a Hugging Face model "
                          "directory with config.json, tokenizer and weights; build the demo policy with `make demo`)")
    if p.exists() and not (p / "config.json").is_file():
        raise ConfigError(f"config key {key}={path!r} is invalid: the directory has no config.json (allowed: a "
                          "Hugging Face model directory with config.json, tokenizer and weights)")


def check_paths(cfg: Config) -> None:
    """The files the run reads exist: model directories and parquet files (ConfigError naming the key).
    Checked when a run starts, not in ``validate``, so configs can be built and checked anywhere."""
    _check_model_dir("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path)
    if cfg.critic.model.path is not None and uses_critic(cfg):
        _check_model_dir("critic.model.path", cfg.critic.model.path)
    for key in ("data.train_files", "data.val_files"):
        value = _get(cfg, key)
        if value is None:
            raise ConfigError(f"config key {key} is not set: name your parquet file(s) (comma-separated, in the "
                              "Search-R1 schema, e.g. from `python -m data_prep.qa_search`); the embedded demo sets it "
                              "with --config configs/demo.yaml")
        for name in [f.strip() for f in value.split(",") if f.strip()] or [value]:
            if not Path(name).is_file():
                raise ConfigError(f"config key {key}={value!r} is invalid: {name!r} does not exist (allowed: "
                                  "comma-separated parquet files in the Search-R1 schema, e.g. from data_prep)")
    if cfg.do_search and cfg.retriever.url is None:
        raise ConfigError("config key retriever.url is not set: name your retrieval service (e.g. "
                          "retriever.url=http://127.0.0.1:8000; retrieval_launch.sh serves on its PORT), required with "
                          "do_search=true; there is no default, so a run never searches another user's service by "
                          "accident (the embedded demo sets it with --config configs/demo.yaml)")


def world_size(cfg: Config) -> int:
    """Ranks of every training group (actor, critic, reference): 1 for the local backend, nodes x workers per node
    for Ray, less the ranks that only generate (``trainer.rollout_ranks``)."""
    t = cfg.trainer
    return 1 if t.backend == "local" else t.nnodes * t.n_gpus_per_node - t.rollout_ranks


def rollout_world_size(cfg: Config) -> int:
    """Ranks that host engines: the rollout ranks when disaggregated, else every training rank."""
    return cfg.trainer.rollout_ranks or world_size(cfg)


def _validate_ranks(cfg: Config) -> None:
    """Rows split evenly over the ranks; tensor-parallel groups tile the ranks (DP = world / TP)."""
    t = cfg.trainer
    total = 1 if t.backend == "local" else t.nnodes * t.n_gpus_per_node
    _require(t.rollout_ranks == 0 or (t.backend == "ray" and 0 < t.rollout_ranks < total), "trainer.rollout_ranks",
             t.rollout_ranks, f"0 (engines on the training ranks) or, with trainer.backend=ray, 1 .. {total - 1} (the "
             f"ranks of trainer.nnodes x trainer.n_gpus_per_node = {total} that only generate)")
    world, engines = world_size(cfg), rollout_world_size(cfg)
    rollout = cfg.actor_rollout_ref.rollout
    tp = rollout.tensor_model_parallel_size
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    _require(engines % tp == 0, key, tp, f"a divisor of the {engines} rank(s) that host engines (trainer.backend="
             f"{t.backend}, trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node}, "
             f"trainer.rollout_ranks={t.rollout_ranks})")
    _require(tp == 1 or rollout.name == "vllm", key, tp, "1 with actor_rollout_ref.rollout.name=hf "
             "(transformers generate has no tensor parallelism; use vllm)")
    rows = trajectories_per_step(cfg)
    _require(rows % world == 0, "data.train_batch_size", cfg.data.train_batch_size,
             f"a size whose rows (x rollout.n = {rows}) split evenly over the {world} ranks")
    mini_batch_keys = ["actor_rollout_ref.actor.ppo_mini_batch_size"]
    if uses_critic(cfg):
        mini_batch_keys.append("critic.ppo_mini_batch_size")
    for key in mini_batch_keys:
        value = _get(cfg, key)
        _require(value % world == 0, key, value, f"a multiple of the world size {world}")


def _pairs(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """A YAML mapping as (dotted key, value) pairs: mappings are walked, anything else is a value."""
    if not isinstance(node, dict) or (prefix and not node):
        return [(prefix, node)]
    return [pair for key, value in node.items() for pair in _pairs(value, f"{prefix}.{key}" if prefix else str(key))]


def parse_override(item: str) -> tuple[str, Any]:
    """``key=value`` -> (key, value parsed as OmegaConf's dotlist parses it: numbers, bools, null, lists)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value")
    key, raw = item.split("=", 1)
    return key.strip(), _hydra_mapping(OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]),
                                                               resolve=False)["v"])


def _hydra_mapping(value: Any) -> Any:
    """Hydra's ``{em:1.0, f1:0.5}`` (no space after the colon) as the mapping it means; YAML reads ``em:1.0`` as a
    key with no value."""
    if not isinstance(value, dict) or not any(isinstance(k, str) and ":" in k and v is None for k, v in value.items()):
        return value
    out = {}
    for k, v in value.items():
        if isinstance(k, str) and ":" in k and v is None:
            k, raw = k.split(":", 1)
            v = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw.strip()}"]), resolve=False)["v"]
        out[k.strip() if isinstance(k, str) else k] = v
    return out


def _shape_error(merged, items: list[tuple[str, Any]]) -> ConfigError:
    """The key of ``items`` whose value cannot merge into ``merged`` (a list where the schema has a mapping, or the
    other way round), as a ConfigError naming it and the shape expected."""
    for key, value in items:
        tree: dict = {}
        _put(tree, key, value)
        try:
            OmegaConf.merge(merged, OmegaConf.create(tree))
        except TypeError:
            expected = "a mapping, e.g. {a: 1.0, b: 0.5}" if isinstance(value, list) else "a list, e.g. [a, b]"
            return ConfigError(f"config key {key}={value!r} is invalid: allowed {expected}")
        except OmegaConfBaseException:
            continue
    return ConfigError(f"the values of {', '.join(key for key, _ in items)} do not fit the config's shape")


def _put(tree: dict, key: str, value: Any) -> None:
    """Set the dotted ``key`` in the nested dict ``tree`` (a later value of a key replaces an earlier one)."""
    *parents, last = key.split(".")
    for part in parents:
        node = tree.get(part)
        if not isinstance(node, dict):
            node = tree[part] = {}
        tree = node
    tree[last] = value


def run_name(cfg: Config) -> str:
    """The default experiment name: ``<data>_<model>_<adv_estimator>``, e.g. ``nq_hotpotqa_Qwen2.5-3B_grpo``
    (data = the first training file's directory, or its stem when that says more). The same command gives
    the same name, so a rerun after a crash finds its checkpoints."""
    first = Path((cfg.data.train_files or "data").split(",")[0].strip())
    data = first.parent.name if first.stem in ("train", "training", "") and first.parent.name else first.stem
    model = Path((cfg.actor_rollout_ref.model.path or "model").rstrip("/")).name
    return re.sub(r"[^\w.+-]+", "-", f"{data}_{model}_{cfg.algorithm.adv_estimator}")


def load_config(overrides: list[str] | None = None, files: tuple[str | Path, ...] | list[str | Path] = ()) -> Config:
    """configs/ppo_trainer.yaml, then each YAML in ``files``, then the ``key=value`` overrides -> a validated Config.

    Keys spelled as Search-R1 or verl spell them are translated first (``config_compat``); each foreign key
    that changes nothing here is logged once as a notice.
    """
    schema = OmegaConf.structured(Config)
    try:
        layers = [_pairs(OmegaConf.to_container(OmegaConf.load(f), resolve=False)) for f in (DEFAULT_CONFIG, *files)]
        layers.append([parse_override(item) for item in overrides or []])
        merged, global_counts, notices = schema, {}, []
        for pairs in layers:  # each layer overrides the ones before it
            layer, tree = translate(pairs), {}
            for key, value in layer.items:
                _put(tree, key, value)
                global_counts.pop(key, None)
            try:
                merged = OmegaConf.merge(merged, OmegaConf.create(tree))
            except TypeError:  # "Cannot merge incompatible container types": a list given for a mapping, or back
                raise _shape_error(merged, layer.items) from None
            global_counts.update(layer.global_counts)
            notices += layer.notices
        cfg = OmegaConf.to_object(merged)
        if cfg.trainer.experiment_name is None:
            merged.trainer.experiment_name = run_name(cfg)
        OmegaConf.resolve(merged)
        cfg = OmegaConf.to_object(merged)
    except ConfigKeyError as err:
        raise ConfigError(f"unknown config key {err.full_key!r} (see configs/ppo_trainer.yaml for all keys, "
                          "docs/config.md for the Search-R1 and verl spellings accepted)") from err
    except OmegaConfBaseException as err:
        raise ConfigError(f"config key {err.full_key!r}: {err.msg.splitlines()[0]}") from err
    except CompatError as err:
        raise ConfigError(str(err)) from err
    world = world_size(cfg)
    for key, (theirs, count) in global_counts.items():
        _set(cfg, key, max(1, count // world))
        notices.append(f"{theirs}={count} is a global count (Search-R1, older verl): "
                       f"{key.rsplit('.', 1)[1]}={_get(cfg, key)} on each of {world} rank(s)")
    for notice in dict.fromkeys(notices):
        logger.warning("config: %s", notice)
    return validate(cfg)


def _set(cfg: Config, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    setattr(_get(cfg, ".".join(parents)) if parents else cfg, last, value)


def uses_critic(cfg: Config) -> bool:
    """The critic exists when the advantage estimator reads critic values (``needs_critic`` in its registration:
    GAE)."""
    return adv_estimator(cfg).needs_critic


def uses_reference(cfg: Config) -> bool:
    """Reference log-probs are needed when any KL term is on."""
    return cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def uses_lora(cfg: Config) -> bool:
    """The actor trains LoRA adapters; the reference is then the actor with its adapters disabled."""
    return cfg.actor_rollout_ref.model.lora_rank > 0


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (saved next to checkpoints and logged at start)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
