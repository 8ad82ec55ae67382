"""Entry point: ``python -m verl.trainer.main_sft [--config FILE ...] key=value ...`` (``search-r1-sft``).

Builds the typed SFT config (``configs/sft_trainer.yaml``, then each ``--config`` YAML, then the overrides;
``verl.config.sft``), builds the trainer (``SFTTrainer``) and calls ``fit()``. Exit status: 0 done, 2 unusable
input (a bad key or value, a missing or malformed data file, a trajectory longer than ``data.max_length``, a
damaged checkpoint, a run directory holding another run), as ``main_ppo`` does.
"""

from __future__ import annotations

import sys

from verl.config import load_sft_config
from verl.trainer import cli
from verl.utils.tracking import check_loggers

HELP = """usage: python -m verl.trainer.main_sft [--config FILE ...] key=value ...

Supervised fine-tuning (a cold start before RL) on multi-turn trajectories, in the agent loop's token layout, with
the loss on the policy's own tokens only. Keys are verl's SFT trainer's (docs/config_sft.md lists them all):

  model.partial_pretrain       the model to start from, a Hugging Face directory
  data.train_files             parquet of trajectories (python -m data_prep.cold_start writes them)
  data.val_files               held-out trajectories (val/loss)
  optim.lr, trainer.total_epochs, model.lora_rank, trainer.save_freq, ...

The run directory (trainer.default_local_dir) gets config.yaml, metrics.jsonl, curves.png, global_step_N/ and
hf_model/: train RL from it with actor_rollout_ref.model.path=<run dir>/hf_model.

Exit status: 0 done, 2 unusable input (the message names the key, file or row)."""


def main(argv: list[str] | None = None) -> int:
    return cli.run(argv, train, lambda argv: HELP, base="configs/sft_trainer.yaml")


def train(files: list[str], overrides: list[str]) -> int:
    """Build the config and the trainer, fit, print where the model is; errors are ``cli.run``'s to report."""
    cfg = load_sft_config(overrides, files)
    check_loggers(cfg.trainer.logger)
    import torch  # after the config is checked: a bad key is refused before torch loads

    from verl.trainer.sft_trainer import SFTTrainer

    torch.manual_seed(cfg.trainer.seed)
    trainer = SFTTrainer(cfg)
    d = cfg.data
    step = f"{d.train_batch_size}" if d.train_batch_tokens is None else f"<= {d.train_batch_tokens} tokens"
    print(f"sft: {len(trainer.train_set)} trajectories ({trainer.train_set.policy_tokens()} policy tokens), "
          f"{trainer.total_steps} steps of {step}, model {cfg.model.partial_pretrain}"
          f"{f' (LoRA rank {cfg.model.lora_rank})' if trainer.lora else ''}, run directory {trainer.out_dir}",
          flush=True)
    final = trainer.fit()
    if trainer.already_complete:
        print(cli.already_complete(trainer.step, trainer.total_steps, trainer.out_dir))
        return 0
    shown = ", ".join(f"{k} {final[k]:.4f}" for k in ("train/loss", "val/loss") if k in final)
    print(f"{shown}; model: {trainer.out_dir / 'hf_model'}  metrics: {trainer.tracker.jsonl_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
