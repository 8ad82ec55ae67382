"""The supervised (SFT) trainer's config: ``configs/sft_trainer.yaml`` + ``--config`` files + ``key=value``.

Choices:
- **verl's SFT key names** where verl's ``fsdp_sft_trainer`` has the setting (``data.train_files``,
  ``data.micro_batch_size_per_gpu``, ``data.max_length``, ``optim.lr``, ``optim.betas``, ``optim.warmup_steps_ratio``,
  ``optim.lr_scheduler``, ``model.partial_pretrain``, ``model.lora_rank``, ``trainer.total_epochs``,
  ``trainer.default_local_dir``, ...), so a verl SFT command line runs here; the rest is the RL trainer's spelling of
  the same setting (``trainer.save_freq``, ``trainer.resume_mode``, ``trainer.logger``).
- **Declared once**, as the RL config is (``verl.config.schema``): ``python -m verl.config.doc`` writes
  ``configs/sft_trainer.yaml`` and ``docs/config_sft.md`` from these declarations, and the same walk checks every
  value. No recipe or plug-in keys: the SFT data are already trajectories (``verl.utils.sft_dataset``), so the
  trainer needs no task code.
- Layers are merged as ``verl.config.load_config`` merges them (OmegaConf, struct mode: an unknown key fails naming
  it); other trainers' spellings are not translated (verl's SFT names are the names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from verl.config.load import CONFIG_DIR, _put, _yaml_pairs, parse_override
from verl.config.rl import _check_model_dir
from verl.config.schema import check_settings, did_you_mean, section, setting
from verl.config.sections import DTYPE_NAMES, LOGGERS
from verl.errors import ConfigError
from verl.utils.lr_schedule import SCHEDULES

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
class SFTOptimConfig:
    lr: float = setting(1e-5, "AdamW learning rate.", low=0, high=1, low_open=True, what="a learning rate")
    weight_decay: float = setting(0.01, "AdamW weight decay.", low=0, high=1, what="a decoupled weight decay")
    betas: list[float] = setting([0.9, 0.999], "AdamW's two moment decay rates, [beta1, beta2] (verl's SFT trainer "
                                 "uses [0.9, 0.95]).")
    warmup_steps_ratio: float = setting(
        0.0, "Fraction of the run's optimiser steps spent warming the LR up linearly from 0; then optim.lr_scheduler.",
        low=0, high=1, what="a fraction of the run's steps")
    lr_scheduler: str = setting("constant", "The learning rate after the warm-up: constant | cosine (half a cosine "
                                "from optim.lr down towards optim.min_lr_ratio x optim.lr, reached just after the "
                                "last step; verl's SFT default).", choices=SCHEDULES)
    min_lr_ratio: float = setting(0.0, "cosine: the floor of the learning rate, as a fraction of optim.lr.", low=0,
                                  high=1, what="a fraction of optim.lr")
    clip_grad: float | None = setting(1.0, "Maximum gradient norm; null = no clipping.", low=0, low_open=True,
                                      null_means="no clipping")


@dataclass
class SFTTrainerConfig:
    total_epochs: int = setting(1, "Passes over the training trajectories.", low=1, steers=True)
    total_training_steps: int | None = setting(
        None, "Stop after this many steps (null = total_epochs worth of steps).", low=1,
        null_means="trainer.total_epochs worth of steps", steers=True)
    project_name: str = setting("search_r1_sft", "Project name used by the trackers and the run directory.")
    experiment_name: str | None = setting(
        None, "Experiment name used by the trackers and the run directory. null = <data>_<model>_sft: the same "
        "command names the same directory, so a rerun resumes it.")
    default_local_dir: str = setting(
        "outputs/${trainer.project_name}/${trainer.experiment_name}", "The run directory: config.yaml, "
        "metrics.jsonl, curves.png, checkpoints, hf_model/ (the model to give RL as actor_rollout_ref.model.path). "
        "A directory that holds another run is refused, never appended to.", steers=True)
    logger: list[str] = setting(
        ["console", "jsonl"], "Trackers: any of {choices}; metrics.jsonl is written whatever this says.",
        choices=LOGGERS, steers=True)
    save_freq: int = setting(
        -1, "Save a checkpoint every this many steps (-1 = never; the last step is always saved when > 0).",
        steers=True)
    test_freq: int = setting(-1, "Log the validation loss every this many steps and at the end (-1 = only at the end "
                             "when data.val_files is set).", steers=True)
    resume_mode: str = setting(
        "auto", "auto = resume from the newest checkpoint in default_local_dir | disable | a checkpoint path.",
        steers=True)
    seed: int = setting(1, "Seed of the shuffling and of weights the checkpoint lacks (LoRA adapters).")
    device: str = setting("auto", "Device: auto (cuda if available) | cpu | cuda.", choices=("auto", "cpu", "cuda"),
                          steers=True)


@dataclass
class SFTConfig:
    """Supervised fine-tuning on multi-turn search trajectories (``python -m verl.trainer.main_sft``), in the agent
    loop's exact token layout, with the loss on the policy's tokens only. Generated from verl/config/sft.py by
    `make docs`; do not edit by hand."""

    data: SFTDataConfig = section(SFTDataConfig)
    model: SFTModelConfig = section(SFTModelConfig)
    optim: SFTOptimConfig = section(SFTOptimConfig)
    trainer: SFTTrainerConfig = section(SFTTrainerConfig)

    def check(self) -> None:
        """The rules between keys."""
        d = self.data
        betas = self.optim.betas
        if len(betas) != 2 or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas):
            raise ConfigError(f"config key optim.betas={list(betas)} is invalid (allowed: two numbers in [0, 1), "
                              "e.g. [0.9, 0.95])")
        if d.train_batch_tokens is None and d.train_batch_size % d.micro_batch_size_per_gpu:
            raise ConfigError(f"config key data.micro_batch_size_per_gpu={d.micro_batch_size_per_gpu} must divide "
                              f"data.train_batch_size={d.train_batch_size}")

    def check_paths(self) -> None:
        """The model directory and parquet files exist (when a run starts)."""
        _check_model_dir("model.partial_pretrain", self.model.partial_pretrain)
        for key, value in (("data.train_files", self.data.train_files), ("data.val_files", self.data.val_files),
                           ("data.mix_files", self.data.mix_files)):
            if value is None:
                if key == "data.train_files":
                    raise ConfigError("config key data.train_files is not set: name your parquet file(s) of "
                                      "trajectories (e.g. from `python -m data_prep.cold_start`)")
                continue
            for name in [f.strip() for f in value.split(",") if f.strip()] or [value]:
                if not Path(name).is_file():
                    raise ConfigError(f"config key {key}={value!r} is invalid: {name!r} does not exist (allowed: "
                                      "comma-separated parquet files of trajectories, e.g. from data_prep.cold_start)")


def sft_run_name(cfg: SFTConfig) -> str:
    """``<data>_<model>_sft``: the first training file's directory (or stem) and the model directory's name."""
    first = Path((cfg.data.train_files or "data").split(",")[0].strip())
    data = first.parent.name if first.stem in ("train", "training", "") and first.parent.name else first.stem
    model = Path((cfg.model.partial_pretrain or "model").rstrip("/")).name
    return re.sub(r"[^\w.+-]+", "-", f"{data}_{model}_sft")


def load_sft_config(overrides: list[str] | None = None, files: list[str | Path] | tuple = ()) -> SFTConfig:
    """``configs/sft_trainer.yaml``, then each YAML in ``files``, then the ``key=value`` overrides -> a checked
    ``SFTConfig``; ConfigError naming the key otherwise."""
    layers: list[list[tuple[str, Any]]] = []
    try:
        layers = [_yaml_pairs(SFT_CONFIG)] + [_yaml_pairs(f) for f in files]
        layers.append([parse_override(item) for item in overrides or []])
        merged = OmegaConf.structured(SFTConfig)
        for pairs in layers:
            tree: dict = {}
            for key, value in pairs:
                _put(tree, key.lstrip("+"), value)
            merged = OmegaConf.merge(merged, OmegaConf.create(tree))
        if merged.trainer.experiment_name is None:
            merged.trainer.experiment_name = sft_run_name(OmegaConf.to_object(merged))
        OmegaConf.resolve(merged)
        cfg = OmegaConf.to_object(merged)
    except ConfigKeyError as err:
        full = str(err.full_key)
        given = next((k for pairs in reversed(layers) for k, _ in pairs
                      if k.lstrip("+") == full or k.lstrip("+").startswith(f"{full}.")), full)
        raise ConfigError(f"unknown config key {given!r}{did_you_mean(given, SFTConfig())} (the SFT trainer takes "
                          "the keys of configs/sft_trainer.yaml; docs/config_sft.md lists them)") from err
    except OmegaConfBaseException as err:
        raise ConfigError(f"config key {err.full_key!r}: {err.msg.splitlines()[0]}") from err
    check_settings(cfg)
    cfg.check()
    return cfg


def sft_to_yaml(cfg: SFTConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
