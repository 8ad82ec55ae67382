"""The trainers' configuration, one package. Callers import the config's API from here (``from verl.config import
Config, load_config``), so the modules can move without breaking them; the package's machinery (the spelling
rules of ``verl.config.compat``, the generator ``verl.config.doc``) is imported from its module.

Modules, bottom to top (each imports only those above it in this list, never this package itself):

- ``schema``: one declaration per setting (``setting``, ``section``) and the one walk that checks them;
- ``compat``: other trainers' spellings of a key (Search-R1, verl) and the keys that change nothing here;
- ``paths``: the files a run reads exist (model directories, data files);
- ``shared``: the sections both trainers hold (the optimiser; the run's keys of ``trainer``);
- ``algorithm``, ``sections``: the RL trainer's other sections;
- ``rl``: the RL trainer's ``Config``, the quantities derived from several keys and the rules between keys;
- ``load``: the recipe and plug-in modules, layers of YAML and ``key=value`` -> a checked config (``load_config``);
- ``sft``: the supervised trainer's config (``load_sft_config``);
- ``doc``: ``python -m verl.config.doc`` (``make docs``) writes the YAML of defaults and docs/config*.md.
"""

from verl.config.algorithm import AlgorithmConfig, FilterGroupsConfig, KLControlConfig, OverlongConfig
from verl.config.compat import renamed_keys
from verl.config.load import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    DEMO_CONFIG,
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
    Config,
    adv_estimator,
    check_paths,
    computes_values_in_update,
    max_sequence_length,
    recomputes_old_log_probs,
    rollout_world_size,
    trajectories_per_step,
    uses_critic,
    uses_lora,
    uses_reference,
    world_size,
)
from verl.config.schema import (
    Setting,
    allowed,
    check_settings,
    declared,
    leaves,
    require,
    section,
    setting,
    steering_keys,
)
from verl.config.sections import (
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    CriticModelConfig,
    CustomRewardConfig,
    DataConfig,
    FSDPConfig,
    ModelConfig,
    MultiTurnConfig,
    PolicyLossConfig,
    RefConfig,
    RefFSDPConfig,
    RolloutConfig,
    TrainerConfig,
    ValKwargs,
)
from verl.config.sft import SFT_CONFIG, SFTConfig, load_sft_config
from verl.config.shared import DTYPE_NAMES, LOGGERS, OptimConfig, RunConfig
from verl.errors import ConfigError

__all__ = [
    "ActorConfig", "ActorRolloutRefConfig", "AlgorithmConfig", "CONFIG_DIR", "Config", "ConfigError",
    "CriticConfig", "CriticModelConfig", "CustomRewardConfig", "DEFAULT_CONFIG", "DEMO_CONFIG", "DTYPE_NAMES",
    "DataConfig", "FSDPConfig", "FilterGroupsConfig", "KLControlConfig", "LOGGERS", "ModelConfig", "MultiTurnConfig",
    "OptimConfig",
    "OverlongConfig", "PolicyLossConfig", "RefConfig", "RefFSDPConfig", "RolloutConfig", "RunConfig", "SFTConfig",
    "SFT_CONFIG", "Setting", "TrainerConfig", "ValKwargs", "adv_estimator", "allowed", "check_paths",
    "check_settings", "declared", "import_plugins", "leaves", "load_config", "load_sft_config",
    "max_sequence_length", "parse_override", "recipe_config", "recipe_module", "recomputes_old_log_probs",
    "computes_values_in_update",
    "renamed_keys", "require", "rollout_world_size", "run_name", "section", "setting", "steering_keys", "to_yaml",
    "trajectories_per_step", "uses_critic", "uses_lora", "uses_reference", "validate", "world_size",
]
