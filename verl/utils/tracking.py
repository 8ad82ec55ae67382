"""One logging path for metrics: console table, JSONL file, W&B and TensorBoard when asked for.

Choices: JSONL is the source of truth (one object per step, appended and flushed, so nothing is
lost on a crash and a resumed run continues the same file); the console shows a compact table of
the metrics people watch; W&B / TensorBoard are optional and fail with a clear message when asked
for but not installed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rich.console import Console

logger = logging.getLogger(__name__)

# Metrics shown on the console's one line per step, with their short names (all metrics go to JSONL / W&B /
# TensorBoard).
CONSOLE_KEYS = {"critic/score/mean": "score", "val/em": "val/em", "actor/pg_loss": "pg_loss",
                "actor/entropy": "entropy", "actor/ppo_kl": "kl", "critic/vf_loss": "vf_loss",
                "agent/searches_per_traj": "searches", "agent/mean_turns": "turns", "timing/step": "s/step"}


class Tracker:
    def __init__(self, loggers: list[str], out_dir: str | Path, project: str, experiment: str, config_dict: dict):
        self.loggers = loggers
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.out_dir / "metrics.jsonl"
        self.console = Console(stderr=True)
        self._wandb = self._tb = None
        if "wandb" in loggers:
            try:
                import wandb
            except ImportError as err:
                raise RuntimeError("trainer.logger includes wandb but wandb is not installed "
                                   "(pip install wandb)") from err
            self._wandb = wandb.init(project=project, name=experiment, config=config_dict, resume="allow")
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RuntimeError("trainer.logger includes tensorboard but tensorboard is not installed") from err
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
        if "jsonl" in self.loggers:
            with self.jsonl_path.open("a") as f:
                f.write(json.dumps({"step": step, **metrics}) + "\n")
        if "console" in self.loggers:
            self._console_line(metrics, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)

    def _console_line(self, metrics: dict[str, float], step: int) -> None:
        """One line per step: the CONSOLE_KEYS present, then validation EM per data source when validated."""
        shown = {short: metrics[key] for key, short in CONSOLE_KEYS.items() if key in metrics}
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
