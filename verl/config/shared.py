"""The sections both trainers hold, declared once: the optimiser (``OptimConfig``: the RL actor's and critic's
``optim``, the SFT trainer's ``optim``) and the run (``RunConfig``: the keys of ``trainer`` that every training run
has: its directory and names, its step budget, trackers, validation and checkpoint frequency, seed and device; the
RL trainer's ``TrainerConfig`` adds its own keys to it).

Choices:
- **Our names, theirs as spellings.** The keys are the RL config's names (verl's: ``optim.lr_warmup_steps_ratio``,
  ``optim.warmup_style``); where verl's SFT trainer spells a key another way (``optim.warmup_steps_ratio``,
  ``optim.lr_scheduler``) that spelling is an ``Alias`` declared on the setting, so a verl SFT command line runs
  as written, in either trainer.
- **Defaults per place.** What differs between the trainers is a default, given where the section is placed
  (``section(OptimConfig, lr=1e-5, weight_decay=0.01)`` for SFT, as for the critic's learning rate); the doc says
  both where they differ.
- **A rule within one section is its ``check(prefix)``** (``prefix``: where the section sits, named in errors),
  called by each config class that holds the section.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from verl.config.compat import RENAMED, Alias
from verl.config.schema import require, setting
from verl.utils.lr_schedule import SCHEDULES

DTYPE_NAMES = ("float32", "bfloat16", "float16")
LOGGERS = ("console", "jsonl", "wandb", "tensorboard")


@dataclass
class OptimConfig:
    lr: float = setting(1e-6, "AdamW learning rate (Search-R1, 3B-parameter models: 1e-6 for the actor, 1e-5 for the "
                        "critic; SFT: 1e-5, verl's SFT default).", low=0, high=1, low_open=True,
                        what="a learning rate (AdamW; typical 1e-6 .. 1e-5)", spellings=(Alias("../lr", RENAMED),))
    lr_warmup_steps_ratio: float = setting(
        0.0, "Fraction of the run's optimiser steps spent warming the LR up linearly from 0; then optim.warmup_style. "
        "verl's SFT name optim.warmup_steps_ratio is the same key.", low=0, high=1, what="a fraction of the run's "
        "steps", spellings=(Alias("../lr_warmup_steps_ratio", RENAMED), Alias("../optim.warmup_steps_ratio")))
    warmup_style: str = setting(
        "constant", "The learning rate after the warm-up: constant | cosine (half a cosine from optim.lr down towards "
        "optim.min_lr_ratio x optim.lr, reached just after the last optimiser step). verl's newer name "
        "optim.lr_scheduler_type and its SFT name optim.lr_scheduler are the same key.", choices=SCHEDULES,
        spellings=(Alias("../optim.lr_scheduler_type"), Alias("../optim.lr_scheduler")))
    min_lr_ratio: float | None = setting(None, "cosine: the floor of the learning rate, as a fraction of optim.lr.",
                                         low=0, high=1, what="a fraction of optim.lr", null_means="0")
    weight_decay: float = setting(0.0, "AdamW weight decay (SFT: 0.01, verl's SFT default).", low=0, high=1,
                                  what="a decoupled weight decay", spellings=(Alias("../weight_decay", RENAMED),))
    betas: list[float] = setting(
        [0.9, 0.999], "AdamW's two moment decay rates, [beta1, beta2] (torch's default; verl's SFT trainer uses "
        "[0.9, 0.95]).", low=0, high=1, high_open=True)

    def check(self, prefix: str) -> None:
        """``betas`` holds two numbers (each one's range is its declaration's)."""
        require(len(self.betas) == 2, f"{prefix}.betas", list(self.betas), "two numbers in [0, 1), e.g. [0.9, 0.95]")


@dataclass
class RunConfig:
    total_epochs: int = setting(1, "Passes over the training data.", low=1, steers=True)
    total_training_steps: int | None = setting(
        None, "Stop after this many steps (null = total_epochs worth of steps).", low=1,
        null_means="trainer.total_epochs worth of steps", steers=True)
    project_name: str = setting(
        "verl", "Project name used by the trackers (W&B project) and the run directory (a recipe may set its own "
        "default). Names the run, does not change it: a rerun may give another (as it may after the default changed).",
        steers=True)
    experiment_name: str | None = setting(
        None, "Experiment name used by the trackers and the run directory. null = <data>_<model>_<estimator>, e.g. "
        "nq_hotpotqa_Qwen2.5-3B_gae (SFT: <data>_<model>_sft): the same command names the same directory, so a rerun "
        "resumes it.")
    default_local_dir: str = setting(
        "outputs/${trainer.project_name}/${trainer.experiment_name}", "The run directory: config.yaml, "
        "metrics.jsonl, curves.png, checkpoints, hf_model/ (an SFT run's is the model RL starts from, as "
        "actor_rollout_ref.model.path). A directory that holds another run (a different config, or metrics but no "
        "checkpoint to resume) is refused, never appended to.", steers=True)
    logger: list[str] = setting(
        ["console", "jsonl"], "Trackers: any of {choices}. The run directory's metrics.jsonl is written whatever this "
        "says (resume, curves.png and the summary read it). wandb needs WANDB_API_KEY, `wandb login` or "
        "WANDB_MODE=offline (no network; logs under the run directory); checked before the model loads.",
        choices=LOGGERS, steers=True)
    test_freq: int = setting(
        10, "Validate every this many steps and after the last one (-1 = never; SFT: -1 = only after the last step, "
        "when data.val_files is set).", steers=True)
    save_freq: int = setting(
        -1, "Save a checkpoint every this many steps (-1 = never; the last step is always saved when > 0).",
        steers=True)
    max_ckpt_to_keep: int | None = setting(
        None, "Keep only this many checkpoints, the newest (the one just written always among them): each save then "
        "deletes the older ones. null = keep every checkpoint. A checkpoint here is one directory holding the actor "
        "and the critic, so verl's two RL keys are this key's other spellings and must agree when both are given.",
        low=1, null_means="keep every checkpoint", what="a number of checkpoints",
        spellings=(Alias("trainer.max_actor_ckpt_to_keep"), Alias("trainer.max_critic_ckpt_to_keep")),
        steers=True)
    resume_mode: str = setting(
        "auto", "auto = resume from the newest checkpoint in default_local_dir | disable | a checkpoint path.",
        steers=True)
    seed: int = setting(1, "Seed of model init noise, sampling and dropout (SFT: of the shuffling, and of weights the "
                        "checkpoint lacks, LoRA adapters).")
    device: str = setting("auto", "Device to train on: auto (cuda if available) | cpu | cuda.",
                          choices=("auto", "cpu", "cuda"), steers=True)
    host_memory: str = setting(
        "reuse", "What a process that trains on the host (CPU) does with freed memory: reuse = keeps it for the "
        "step's next micro-batches and passes (glibc's heap only) and hands free pages back after each optimiser step, "
        "so few fresh pages are faulted in and zeroed (the real model's update took about 0.6x the time on 2 cores), "
        "and whenever less than a quarter of the host's memory is available (perf/host_memory_trims counts those "
        "times) | release = large blocks mapped on their own and free pages handed back after each micro-batch: a "
        "lower peak within a step, at the price of those page faults. No effect on a GPU, without glibc, or when the "
        "environment sets malloc tunables (MALLOC_*_, GLIBC_TUNABLES).", choices=("reuse", "release"), steers=True)

    def check(self, prefix: str) -> None:
        """``resume_mode``: a word or a path that exists (one key, but its allowed values are not a list)."""
        mode = self.resume_mode
        require(mode in ("auto", "disable") or Path(mode).exists(), f"{prefix}.resume_mode", mode,
                "auto, disable or an existing checkpoint path")
