"""The supervised (SFT) trainer's config: ``configs/sft_trainer.yaml`` + ``--config`` files + ``key=value``.

Choices:
- **The RL trainer's sections where the setting is the same** (``verl.config.shared``): ``optim`` is the RL
  optimiser's section (``OptimConfig``) plus ``clip_grad``, the gradient-norm bound that the RL config keeps on the
  actor and critic (``grad_clip``); ``trainer`` is the run's section every training run has (``RunConfig``; the RL
  trainer's ``TrainerConfig`` adds its own keys to it). Defaults that differ are given where the section is placed
  (``optim.lr`` 1e-5, ``optim.weight_decay`` 0.01, ``trainer.project_name``, ``trainer.test_freq``), and the rules
  within a section are the section's (``OptimConfig.check``, ``RunConfig.check``).
- **verl's SFT key names** (``fsdp_sft_trainer``) run as written: where the shared section names a key as the RL
  trainer does, verl's SFT name is an alias declared on the setting (``optim.warmup_steps_ratio`` is
  ``optim.lr_warmup_steps_ratio``, ``optim.lr_scheduler`` is ``optim.warmup_style``; docs/config_sft.md lists
  them), and a run directory saved under those names continues (``verl.config.compat.renamed_keys``). The SFT-only
  sections keep verl's SFT names (``data.micro_batch_size_per_gpu``, ``data.max_length``,
  ``model.partial_pretrain``, ...).
- **Declared once and loaded as the RL config is** (``verl.config.schema``, ``verl.config.load.merge_layers``):
  ``python -m verl.config.doc`` writes ``configs/sft_trainer.yaml`` and ``docs/config_sft.md`` from these
  declarations, and the same walk checks every value. No recipe or plug-in keys: the SFT data are already
  trajectories (``verl.utils.sft_dataset``), so the trainer needs no task code, and no keys of other trainers
  that change nothing (``no_effect_keys`` is empty).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from verl.config.compat import NoEffect
from verl.config.load import (
    CONFIG_DIR,
    config_errors,
    experiment_name,
    log_notices,
    merge_layers,
    parse_override,
    validate,
    yaml_pairs,
)
from verl.config.paths import check_files, check_model_dir
from verl.config.schema import require, section, setting
from verl.config.shared import DTYPE_NAMES, OptimConfig, RunConfig
from verl.errors import ConfigError

SFT_CONFIG = CONFIG_DIR / "sft_trainer.yaml"  # generated: python -m verl.config.doc


@dataclass
class SFTDataConfig:
    train_files: str | None = setting(
        None, "Parquet file(s) of trajectories (comma-separated): the RL schema (prompt, reward_model, data_source, "
        "extra_info) plus turns: [{text, sampled}], the response in order (sampled = written by the policy: trained; "
        "else inserted by the environment: context only). python -m data_prep.cold_start writes them. Required.")
    val_files: str | None = setting(
        None, "Parquet file(s) of held-out trajectories: their loss (val/loss) is logged every trainer.test_freq "
        "steps. null = no validation.")
    train_batch_size: int = setting(16, "Trajectories per optimiser step, over all ranks (unused when "
                                    "data.train_batch_tokens is set).", low=1)
    train_batch_tokens: int | None = setting(
        None, "Padded tokens per optimiser step, instead of a fixed number of trajectories: each epoch the "
        "trajectories are grouped by length into steps of rows x longest <= this many tokens (a longer trajectory is "
        "a step of its own), in shuffled order, so little compute goes to padding; the loss is then the sum over the "
        "step's policy tokens divided by an epoch's mean policy tokens per step, so every policy token weighs the "
        "same whichever step it lands in. null = data.train_batch_size trajectories a step, token-mean loss.",
        low=1, null_means="data.train_batch_size trajectories a step")
    micro_batch_size_per_gpu: int = setting(
        4, "Trajectories per forward/backward pass (gradients are accumulated up to train_batch_size; the loss is "
        "normalised by the step's policy tokens, so this changes only memory and speed).", low=1)
    max_length: int = setting(
        4096, "Longest trajectory (prompt + response tokens) allowed; a longer one is an error naming the file and "
        "row (never cut: a cut trajectory would teach the policy to stop mid-turn).", low=2)
    shuffle: bool = setting(True, "Shuffle the trajectories each epoch (seeded by trainer.seed).")
    mix_files: str | None = setting(
        None, "Parquet file(s) of text rows mixed into every step as a second objective (a skill the model brings, "
        "kept while it learns the trajectories): a column turns: [{text, sampled}] only, no prompt and no chat "
        "template; a row's leading unsampled turns are its context, the sampled ones are trained. null = no mix.",
        null_means="no second objective")
    mix_rows_per_step: int = setting(8, "Text rows of data.mix_files drawn for each step (in a shuffled order, seeded "
                                     "by trainer.seed; the order resumes with the checkpoint).", low=1)
    mix_loss_coef: float = setting(
        1.0, "Each step's loss adds this times the mean NLL per trained token of its data.mix_files rows (logged as "
        "train/mix_loss).", low=0, what="a loss weight")


@dataclass
class SFTModelConfig:
    partial_pretrain: str | None = setting(
        None, "Hugging Face model directory to start from (config, weights, tokenizer). Required.")
    trust_remote_code: bool = setting(False, "Let transformers run custom modelling code from the model directory.")
    enable_gradient_checkpointing: bool | None = setting(
        None, "Recompute activations in the backward pass to save memory (slower); null = on for models above 1B "
        "parameters.")
    lora_rank: int = setting(
        0, "LoRA rank (peft); 0 = train all weights. With LoRA only the adapters are trained and checkpointed; "
        "hf_model/ is exported merged, so RL starts from it as from any model.", low=0)
    lora_alpha: float = setting(16.0, "LoRA scaling numerator: adapters are scaled by lora_alpha / lora_rank.", low=0,
                                low_open=True, what="LoRA's scale numerator")
    target_modules: list[str] = setting(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                        "Modules (by name) that get adapters.")
    dtype: str = setting(
        "float32", "Compute dtype of the forward and backward passes (autocast; the weights stay float32): "
        "{choices}.", choices=DTYPE_NAMES)


@dataclass
class SFTOptimConfig(OptimConfig):
    """The RL optimiser's section (``OptimConfig``) and the gradient-norm bound, which verl's SFT trainer keeps in
    ``optim`` and the RL config on the actor and critic (``grad_clip``)."""

    clip_grad: float | None = setting(1.0, "Maximum gradient norm; null = no clipping.", low=0, low_open=True,
                                      null_means="no clipping")


@dataclass
class SFTConfig:
    """Supervised fine-tuning on multi-turn search trajectories (``python -m verl.trainer.main_sft``), in the agent
    loop's exact token layout, with the loss on the policy's tokens only. Generated from verl/config/sft.py and
    verl/config/shared.py by `make docs`; do not edit by hand."""

    no_effect_keys: ClassVar[dict[str, NoEffect]] = {}  # none: an unknown key is an error (verl.config.compat)

    data: SFTDataConfig = section(SFTDataConfig)
    model: SFTModelConfig = section(SFTModelConfig)
    optim: SFTOptimConfig = section(SFTOptimConfig, lr=1e-5, weight_decay=0.01, min_lr_ratio=0.0)
    trainer: RunConfig = section(RunConfig, project_name="verl_sft", test_freq=-1)

    def check(self) -> None:
        """The rules within the shared sections, then between keys."""
        self.optim.check("optim")
        self.trainer.check("trainer")
        d = self.data
        require(d.train_batch_tokens is not None or d.train_batch_size % d.micro_batch_size_per_gpu == 0,
                "data.micro_batch_size_per_gpu", d.micro_batch_size_per_gpu,
                f"a divisor of data.train_batch_size={d.train_batch_size}")

    def check_paths(self) -> None:
        """The model directory and parquet files exist (when a run starts)."""
        check_model_dir("model.partial_pretrain", self.model.partial_pretrain)
        if self.data.train_files is None:
            raise ConfigError("config key data.train_files is not set: name your parquet file(s) of trajectories (e.g. "
                              "from `python -m data_prep.cold_start`)")
        for key, value in (("data.train_files", self.data.train_files), ("data.val_files", self.data.val_files),
                           ("data.mix_files", self.data.mix_files)):
            if value is not None:
                check_files(key, value, "comma-separated parquet files of trajectories, e.g. from data_prep.cold_start")


def sft_run_name(cfg: SFTConfig) -> str:
    """``<data>_<model>_sft``: the first training file's directory (or stem) and the model directory's name."""
    return experiment_name(cfg.data.train_files, cfg.model.partial_pretrain, "sft")


def load_sft_config(overrides: list[str] | None = None, files: list[str | Path] | tuple = ()) -> SFTConfig:
    """``configs/sft_trainer.yaml``, then each YAML in ``files``, then the ``key=value`` overrides -> a checked
    ``SFTConfig``; ConfigError naming the key otherwise (as the user spelled it)."""
    with config_errors():
        layers = [yaml_pairs(SFT_CONFIG)] + [yaml_pairs(f) for f in files]
        layers.append([parse_override(item) for item in overrides or []])
        layered = merge_layers(SFTConfig, layers, sft_run_name, "the SFT trainer takes the keys of "
                               "configs/sft_trainer.yaml; docs/config_sft.md lists them")
    log_notices(layered.notices)
    return validate(layered.cfg, layered.given_as)
