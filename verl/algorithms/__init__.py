"""The RL algorithms as pure tensor functions, below the workers and the trainer (docs/design.md, "Layout and import
rules"): advantage and KL estimators, policy and value losses, masked statistics, log-probs from logits, and the
registries that name them (``registry``). Nothing here imports config objects, workers, Ray, vLLM or FSDP.

Importing the package registers every built-in (``core_algos``: GAE, GRPO, RLOO, REINFORCE++, the KL estimators,
and through ``policy_losses`` the policy losses; ``turn_credit``: the turn-level estimator built on GRPO's), so
whoever asks a registry for the allowed names imports ``verl.algorithms`` first.
"""

from verl.algorithms import core_algos, turn_credit  # noqa: F401 -- registers the built-ins
