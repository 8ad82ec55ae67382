"""One logging path for metrics: console table, JSONL file, W&B and TensorBoard when asked for.

Choices: JSONL is the source of truth (one object per step, appended and flushed, so nothing is
lost on a crash and a resumed run continues the same file). The run directory's ``metrics.jsonl`` is
therefore written whatever ``trainer.logger`` says (resume, the curves and the final summary read it);
``jsonl`` in the list is accepted and changes nothing. The console shows a compact table of the
metrics people watch; W&B / TensorBoard are optional. ``check_loggers`` runs before any model loads:
a logger that cannot start (package missing; W&B with no API key and not offline) is a ConfigError
there, never a traceback after start-up. W&B writes under the run directory, so ``WANDB_MODE=offline``
needs no network (``wandb sync <run dir>/wandb/offline-run-*`` uploads it later).
"""

from __future__ import annotations

import json
import logging
import netrc
import os
from pathlib import Path

from rich.console import Console

from verl.errors import ConfigError

logger = logging.getLogger(__name__)

# The console's one line per step: short name -> the metrics it shows, the first one the step logged (all metrics go
# to JSONL / W&B / TensorBoard). ``kl`` is the KL to the reference that the loss uses: the actor's KL loss
# (actor.use_kl_loss), else the in-reward penalty's KL (algorithm.use_kl_in_reward); absent when neither is on.
# (actor/ppo_kl, the KL to the policy that sampled the batch, is 0 on an on-policy update: in the JSONL only.)
CONSOLE_COLUMNS = {"score": ("critic/score/mean",), "val/em": ("val/em",), "pg_loss": ("actor/pg_loss",),
                   "entropy": ("actor/entropy",), "kl": ("actor/kl_loss", "actor/reward_kl_penalty"),
                   "vf_loss": ("critic/vf_loss",), "searches": ("agent/searches_per_traj",),
                   "turns": ("agent/mean_turns",), "loss": ("train/loss",), "val/loss": ("val/loss",),
                   "s/step": ("timing/step",)}


def _wandb_has_key() -> bool:
    """An API key in the environment or in ~/.netrc (where `wandb login` writes it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_loggers(loggers: list[str]) -> None:
    """Fail now, before any model loads, if a logger of ``trainer.logger`` cannot start (ConfigError -> exit 2)."""
    if "wandb" in loggers:
        try:
            import wandb  # noqa: F401
        except ImportError as err:
            raise ConfigError("trainer.logger includes wandb but wandb is not installed: pip install wandb (or the "
                              "[trackers] extra), or drop wandb from trainer.logger") from err
        mode = os.environ.get("WANDB_MODE", "online")
        if mode not in ("offline", "disabled", "dryrun") and not _wandb_has_key():
            raise ConfigError("trainer.logger includes wandb but W&B has no API key: set WANDB_API_KEY or run "
                              "`wandb login`, or set WANDB_MODE=offline to log into the run directory with no network "
                              "(upload later with `wandb sync`)")
    if "tensorboard" in loggers:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as err:
            raise ConfigError("trainer.logger includes tensorboard but tensorboard is not installed: pip install "
                              "tensorboard (or the [trackers] extra), or drop tensorboard from trainer.logger") from err


class Tracker:
    def __init__(self, loggers: list[str], out_dir: str | Path, project: str, experiment: str, config_dict: dict):
        self.loggers = loggers
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.out_dir / "metrics.jsonl"
        self.console = Console(stderr=True)
        self._wandb = self._tb = None
        check_loggers(loggers)
        if "wandb" in loggers:
            import wandb

            self._wandb = wandb.init(project=project, name=experiment, config=config_dict, resume="allow",
                                     dir=str(self.out_dir))
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))

    def truncate_after(self, step: int) -> None:
        """Drop JSONL records of steps after ``step`` (a resumed run re-does them), and a last line torn by a
        kill mid-write; the file is replaced atomically, so a kill now cannot lose the records kept."""
        if not self.jsonl_path.exists():
            return
        kept = []
        for line in self.jsonl_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("dropping a torn line of %s: %r", self.jsonl_path, line[:80])
                continue
            if record.get("step", 0) <= step:
                kept.append(line)
        tmp = self.jsonl_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.jsonl_path)

    def log(self, metrics: dict[str, float], step: int) -> None:
        metrics = {k: float(v) for k, v in metrics.items()}
        with self.jsonl_path.open("a") as f:  # always: the run's record (module docstring)
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if "console" in self.loggers:
            self._console_line(metrics, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)

    def _console_line(self, metrics: dict[str, float], step: int) -> None:
        """One line per step: the CONSOLE_COLUMNS the step logged, then validation EM per data source when
        validated."""
        shown = {short: next(metrics[key] for key in keys if key in metrics)
                 for short, keys in CONSOLE_COLUMNS.items() if any(key in metrics for key in keys)}
        shown.update({k: v for k, v in metrics.items() if k.startswith("val/em/")})
        if shown:
            self.console.print(f"step {step}  " + "  ".join(f"{k} {v:.4g}" for k, v in shown.items()),
                               highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
