"""The trainer's configuration, one package: callers import what they need from here (``from verl.config import
Config, load_config``), never from a module of the package, so the modules can move without breaking them.

Modules, bottom to top (each imports only those above it in this list, never this package itself):

- ``schema``: one declaration per setting (``setting``, ``section``) and the one walk that checks them;
- ``compat``: other trainers' spellings of a key (Search-R1, verl) and the keys that change nothing here;
- ``algorithm``, ``sections``: the RL trainer's sections;
- ``rl``: the quantities derived from several keys and the rules between keys;
- ``load``: ``Config``, the recipe and plug-in modules, layers of YAML and ``key=value`` -> a checked config;
- ``sft``: the supervised trainer's config;
- ``doc``: ``python -m verl.config.doc`` (``make docs``) writes the YAML of defaults and docs/config*.md.
"""

from verl.config.algorithm import AlgorithmConfig, FilterGroupsConfig, KLControlConfig, OverlongConfig
from verl.config.load import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    DEMO_CONFIG,
    Config,
    check_paths,
    import_plugins,
    load_config,
    parse_override,
    recipe_config,
    recipe_module,
    run_name,
    to_yaml,
    validate,
)
from verl.config.rl import (
    adv_estimator,
    max_sequence_length,
    recomputes_old_log_probs,
    require,
    rollout_world_size,
    trajectories_per_step,
    uses_critic,
    uses_lora,
    uses_reference,
    world_size,
)
from verl.config.schema import Setting, allowed, check_settings, declared, leaves, section, setting, steering_keys
from verl.config.sections import (
    DTYPE_NAMES,
    LOGGERS,
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    CriticModelConfig,
    CustomRewardConfig,
    DataConfig,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    PolicyLossConfig,
    RefConfig,
    RefFSDPConfig,
    RolloutConfig,
    TrainerConfig,
    ValKwargs,
)
from verl.config.sft import SFT_CONFIG, SFTConfig, load_sft_config, sft_to_yaml
from verl.errors import ConfigError

__all__ = [
    "ActorConfig", "ActorRolloutRefConfig", "AlgorithmConfig", "CONFIG_DIR", "Config", "ConfigError",
    "CriticConfig", "CriticModelConfig", "CustomRewardConfig", "DEFAULT_CONFIG", "DEMO_CONFIG", "DTYPE_NAMES",
    "DataConfig", "FSDPConfig", "FilterGroupsConfig", "KLControlConfig", "LOGGERS", "ModelConfig", "OptimConfig",
    "OverlongConfig", "PolicyLossConfig", "RefConfig", "RefFSDPConfig", "RolloutConfig", "SFTConfig", "SFT_CONFIG",
    "Setting", "TrainerConfig", "ValKwargs", "adv_estimator", "allowed", "check_paths", "check_settings",
    "declared", "import_plugins", "leaves", "load_config", "load_sft_config", "max_sequence_length",
    "parse_override", "recipe_config", "recipe_module", "recomputes_old_log_probs", "require", "rollout_world_size",
    "run_name", "section", "setting", "sft_to_yaml", "steering_keys", "to_yaml", "trajectories_per_step",
    "uses_critic", "uses_lora", "uses_reference", "validate", "world_size",
]
