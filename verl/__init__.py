"""verl: the PPO/GRPO trainer (single controller, workers, rollout). See docs/design.md for the map."""

from verl import _imports

_imports.install()
