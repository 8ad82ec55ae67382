"""Supervised fine-tuning on multi-turn trajectories: the cold start before RL (``python -m verl.trainer.main_sft``).

One step = ``data.train_batch_size`` trajectories in the RL loop's token layout (``verl.utils.sft_dataset``), one
AdamW step on the mean negative log-likelihood of their policy tokens (``loss_mask`` 1: the tokens the policy wrote;
the prompt and the blocks the environment inserted, for example a search's passages, are context, as under RL's
state masking).

Choices, and what is shared with the RL trainer (so a cold-started policy is trained as RL later trains it):
- The model is built by ``model_utils.load_model`` (dropout off, LoRA through ``lora.py``, gradient checkpointing),
  optimised by ``train_utils.TrainState`` (AdamW, linear warmup then constant, gradient clipping, micro-batch
  accumulation with the loss normalised by the step's global token count, non-finite steps skipped), and its
  log-probs come from ``model_utils.response_log_probs``, the function the actor's PPO loss uses.
- Loss: token-mean over the step's policy tokens (every policy token weighs the same, whichever row it is in;
  verl's SFT trainer does the same). With ``data.train_batch_tokens`` the steps are groups of similar length
  (``TokenBudgetLoader``) and the divisor is a constant, the epoch's mean policy tokens per step: a step's own count
  would give a token in a step of many short rows less weight than one in a step of a few long rows, and what the
  policy learns would follow how rows fall into steps (the demo's tiny policy then searched where its data guessed).
- The run directory, checkpoints and resume are the RL trainer's (``run_dir.claim``, ``checkpoint.begin/commit``,
  ``verify``): ``global_step_N/model`` holds the trainable weights and optimiser, ``trainer.pt`` the step and the
  loader's position, so a rerun of the same command continues where the last checkpoint was written, with the
  same batches. ``hf_model/`` (merged under LoRA) is written at the end: give it to RL as
  ``actor_rollout_ref.model.path``.
- The prompt tokens every training row starts with (the instruction, a chat template's system prompt) run once per
  micro-batch and their keys and values serve every row (``verl/workers/shared_prefix.py``, equal to the actor's
  log-probs to float rounding); in the demo that is half of each row's tokens.
- A second objective (``data.mix_files``): each step draws ``data.mix_rows_per_step`` text rows and adds
  ``data.mix_loss_coef`` times their mean NLL per trained token to the step's loss, as InstructGPT's PPO-ptx mixes
  pre-training text into RL. A skill the model brings (the demo's tiny model: copying a name out of its context,
  formed by a copy task) is kept while the trajectories are learnt; rows of the trajectory data cannot do that, because
  the skill sits where no policy turn is (inside the prompt).
- One process (``trainer.device``): a cold start is short next to RL; no data-parallel ranks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.algorithms.core_algos import agg_loss
from verl.config import SFTConfig, renamed_keys, steering_keys, to_yaml
from verl.errors import ConfigError
from verl.protocol import Batch
from verl.utils import checkpoint, run_dir
from verl.utils.dataset import StatefulLoader
from verl.utils.plots import plot_curves
from verl.utils.progress import progress
from verl.utils.sft_dataset import TextDataset, TokenBudgetLoader, TrajectoryDataset
from verl.utils.tracking import Tracker, read_metrics
from verl.workers.export import save_hf_model
from verl.workers.lora import LoraSpec
from verl.workers.model_files import check_model_files
from verl.workers.model_utils import DTYPES, load_model, resolve_device, response_log_probs
from verl.workers.shared_prefix import PrefixSharing
from verl.workers.train_utils import GlobalCounts, TrainState

logger = logging.getLogger(__name__)

PART = "model"  # the checkpoint's directory of weights and optimiser
PANELS = (("policy-token loss", ["train/loss", "val/loss", "train/mix_loss"]), ("gradient norm", ["train/grad_norm"]),
          ("learning rate", ["train/lr"]))


class SFTTrainer:
    def __init__(self, cfg: SFTConfig):
        self.cfg = cfg
        cfg.check_paths()
        m, d, t = cfg.model, cfg.data, cfg.trainer
        try:
            check_model_files(m.partial_pretrain, m.trust_remote_code)
        except ValueError as err:
            raise ConfigError(f"config key model.partial_pretrain={m.partial_pretrain!r} is invalid: {err} (allowed: "
                              "a Hugging Face model directory whose config.json, tokenizer and weights load)") from None
        self.out_dir = Path(t.default_local_dir)
        # checks only: config.yaml is written once every start-up check has passed (run_dir)
        run_dir.claim(self.out_dir, to_yaml(cfg), t.resume_mode, False, steering_keys(cfg), to_yaml(type(cfg)()),
                      renamed_keys(type(cfg)))
        self.resume_from = run_dir.resume_checkpoint(self.out_dir, t.resume_mode, [PART])
        self.tokenizer = AutoTokenizer.from_pretrained(m.partial_pretrain, trust_remote_code=m.trust_remote_code)
        self.train_set = TrajectoryDataset(d.train_files, self.tokenizer, d.max_length)
        self.val_set = TrajectoryDataset(d.val_files, self.tokenizer, d.max_length) if d.val_files else None
        if d.train_batch_tokens is None:
            self.loader = StatefulLoader(self.train_set, d.train_batch_size, d.shuffle, t.seed)
            self.token_divisor = None  # token-mean over the step's own policy tokens
        else:
            self.loader = TokenBudgetLoader(self.train_set, d.train_batch_tokens, d.shuffle, t.seed)
            self.token_divisor = self.loader.policy_tokens_per_step()  # constant: every token weighs the same
        self.total_steps = t.total_training_steps or self.loader.batches_per_epoch() * t.total_epochs
        self.mix_loader = self._mix_loader() if d.mix_files else None
        self.step = 0
        self.already_complete = False
        self.device = resolve_device(t.device)
        self.dtype = DTYPES[m.dtype]
        self.lora = LoraSpec(m.lora_rank, m.lora_alpha, tuple(m.target_modules)) if m.lora_rank > 0 else None
        self.model = load_model(AutoModelForCausalLM, m.partial_pretrain, device=self.device, dtype=torch.float32,
                                seed=t.seed, trainable=True, gradient_checkpointing=m.enable_gradient_checkpointing,
                                trust_remote_code=m.trust_remote_code, lora=self.lora)
        # the prompt tokens all rows of a micro-batch start with (the instruction) run once (shared_prefix.py)
        self.prefix_sharing = PrefixSharing(self.model)
        self.state = TrainState.from_optim(self.model, cfg.optim, self.total_steps, cfg.optim.clip_grad,
                                           host_memory=cfg.trainer.host_memory)
        run_dir.record_config(self.out_dir, to_yaml(cfg))
        self.tracker = Tracker(t.logger, self.out_dir, t.project_name, t.experiment_name,
                               OmegaConf.to_container(OmegaConf.structured(cfg)))
        self.last_validation: dict[str, float] = {}

    def fit(self) -> dict[str, float]:
        """Train for ``total_steps`` steps (after the resumed checkpoint's), then write ``hf_model/``; returns the last
        step's metrics (with the final validation loss when there are validation files)."""
        self.resume()
        if self.step >= self.total_steps:
            self.already_complete = True
            self.tracker.close()
            if not (self.out_dir / "hf_model").is_dir():  # killed between the last checkpoint and the export
                self.export()
            return {}
        metrics: dict[str, float] = {}
        batches = self._batch_stream()
        self.mix_batches = self._mix_stream() if self.mix_loader is not None else None
        with progress(total=self.total_steps, initial=self.step, desc="sft", unit="step") as bar:
            while self.step < self.total_steps:
                self.step += 1
                start = time.perf_counter()
                metrics = self.train_step(next(batches))
                metrics["timing/step"] = time.perf_counter() - start
                if self.val_set is not None and (self._due(self.cfg.trainer.test_freq)
                                                 or self.step == self.total_steps):
                    metrics.update(self.validate())
                self.tracker.log(metrics, step=self.step)
                if self._due(self.cfg.trainer.save_freq):  # after the log: a kill in between redoes the step
                    self.save()
                bar.set_postfix(loss=f"{metrics['train/loss']:.3f}")
                bar.update()
        self.tracker.close()
        self.export()
        plot_curves(self.tracker.jsonl_path, self.out_dir / "curves.png", self.cfg.trainer.experiment_name, PANELS)
        return metrics

    def _mix_loader(self) -> StatefulLoader:
        d = self.cfg.data
        mix_set = TextDataset(d.mix_files, self.tokenizer, d.max_length)
        if d.mix_rows_per_step > len(mix_set):
            raise ConfigError(f"config key data.mix_rows_per_step={d.mix_rows_per_step} is invalid: data.mix_files="
                              f"{d.mix_files!r} holds {len(mix_set)} rows (allowed: 1 to {len(mix_set)})")
        return StatefulLoader(mix_set, d.mix_rows_per_step, True, self.cfg.trainer.seed)

    def export(self) -> None:
        """``hf_model/``: the trained model as a Hugging Face directory (merged under LoRA), RL's starting point."""
        m = self.cfg.model
        save_hf_model(self.model, self.lora, m.partial_pretrain, m.trust_remote_code, str(self.out_dir / "hf_model"))

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimiser step on ``batch``: ``train/loss`` (mean NLL per policy token), ``train/grad_norm``,
        ``train/lr``, ``train/policy_tokens``, ``train/skipped_updates``."""
        rows = self.cfg.data.micro_batch_size_per_gpu
        mix = [next(self.mix_batches)] if self.mix_loader is not None else []

        def loss_fn(micro: Batch, counts: GlobalCounts) -> tuple[Tensor, dict[str, float]]:
            loss, metrics = self._micro_batch_loss(micro, counts)
            if mix:  # once per step, with the first micro-batch
                mix_loss = self._mix_loss(mix.pop())
                loss = loss + self.cfg.data.mix_loss_coef * mix_loss
                metrics["mix_loss"] = mix_loss.item()
            return loss, metrics

        out = self.state.update(batch, len(batch), 1, lambda mini: mini.split(rows), loss_fn)
        out["policy_tokens"] = float(batch["loss_mask"].sum())
        return {f"train/{name}": value for name, value in out.items()}

    def _micro_batch_loss(self, micro: Batch, counts: GlobalCounts) -> tuple[Tensor, dict[str, float]]:
        """The NLL summed over the micro-batch's policy tokens, divided by the step's policy tokens (so the micro-batch
        losses add up to the step's token mean) or, with ``data.train_batch_tokens``, by the constant mean policy
        tokens per step (steps of short rows hold more rows; each token weighs the same in every step). The logged
        ``loss`` is the token mean either way."""
        mask = micro["loss_mask"].to(self.device).float()  # [b, R], 1 = sampled by the policy (trained)
        log_prob = self._log_probs(micro)  # [b, R]
        divisor = self.token_divisor or counts.tokens
        loss = -agg_loss(log_prob, mask, "token-mean", global_tokens=divisor)
        return loss, {"loss": loss.item() * divisor / counts.tokens}

    def _mix_loss(self, mix: Batch) -> Tensor:
        """The mean NLL per trained token of a step's text rows (``data.mix_files``)."""
        mask = mix["loss_mask"].to(self.device).float()  # [m, R], 1 = a sampled turn's token
        return -(self._log_probs(mix) * mask).sum() / mask.sum()

    def _log_probs(self, micro: Batch) -> Tensor:
        """Log-probs [b, R] of the micro-batch's responses; the shared prompt prefix run once when there is one
        (``verl/workers/shared_prefix.py``: the same values)."""
        return self.prefix_sharing.log_probs(micro, self.device, self.dtype)[0]

    def validate(self) -> dict[str, float]:
        """``val/loss``: the mean NLL per policy token of the validation trajectories (no gradient)."""
        assert self.val_set is not None
        total, tokens = 0.0, 0.0
        self.model.eval()
        rows = self.cfg.data.micro_batch_size_per_gpu
        with torch.no_grad():
            for start in range(0, len(self.val_set), rows):
                micro = self.val_set.batch(range(start, min(start + rows, len(self.val_set))))
                mask = micro["loss_mask"].to(self.device).float()  # [b, R]
                log_prob, _ = response_log_probs(self.model, micro, self.device, self.dtype)
                total -= float((log_prob * mask).sum())
                tokens += float(mask.sum())
        self.model.train()
        self.last_validation = {"val/loss": total / max(tokens, 1.0)}
        return self.last_validation

    def save(self) -> Path:
        with checkpoint.writing(self.out_dir, self.step) as tmp:
            self.state.save(str(tmp / PART))
            state = {"step": self.step, "loader": self.loader.state_dict()}
            if self.mix_loader is not None:
                state["mix_loader"] = self.mix_loader.state_dict()
            path = checkpoint.commit(self.out_dir, tmp, self.step, state, to_yaml(self.cfg))
        logger.info("saved checkpoint %s", path)
        checkpoint.prune(self.out_dir, self.cfg.trainer.max_ckpt_to_keep, self.step)  # after: a failed save keeps all
        return path

    def resume(self) -> None:
        """Load the checkpoint ``trainer.resume_mode`` names (auto = the newest, if any); continue after its step."""
        path = self.resume_from  # found and verified at start-up (run_dir.claim)
        if path is None:
            self.tracker.truncate_after(-1)
            return
        logger.info("resuming from %s", path)
        self.state.load(str(path / PART))
        state = checkpoint.load_trainer_state(path)
        self.step = state["step"]
        self.loader.load_state_dict(state["loader"])
        if self.mix_loader is not None and "mix_loader" in state:
            self.mix_loader.load_state_dict(state["mix_loader"])
        self.tracker.truncate_after(self.step)
        records = read_metrics(self.tracker.jsonl_path) if self.tracker.jsonl_path.exists() else []
        self.last_validation = next(({k: v for k, v in r.items() if k.startswith("val/")} for r in reversed(records)
                                     if "val/loss" in r), {})

    def _batch_stream(self) -> Iterator[Batch]:
        while True:
            yield from self.loader

    def _mix_stream(self) -> Iterator[Batch]:
        while True:
            yield from self.mix_loader

    def _due(self, freq: int) -> bool:
        return freq > 0 and (self.step % freq == 0 or self.step == self.total_steps)
