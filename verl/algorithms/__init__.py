"""The RL algorithms as pure tensor functions, below the workers and the trainer (docs/design.md, "Layout and import
rules"): advantage and KL estimators, policy and value losses, masked statistics, log-probs from logits, and the
registries that name them (``registry``). Nothing here imports config objects, workers, Ray, vLLM or FSDP.

The built-ins (``core_algos``: GAE, GRPO, RLOO, REINFORCE++, the KL estimators, and through ``policy_losses`` the
policy losses; ``turn_credit``: the turn-level estimator built on GRPO's) are registered the first time a registry
is asked for a name or given one (``Registry.builtins_from``): those modules import torch, and a config is checked
(an unknown key refused) before torch is imported.
"""

from verl.algorithms.registry import ADV_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

_WITH_BUILTINS = (ADV_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS)


def register_builtins() -> None:
    """Import the modules whose decorators register the built-in estimators, losses and KL estimators (once: the
    other registries' hooks are cleared first, as these modules register into all three)."""
    for registry in _WITH_BUILTINS:
        registry.builtins_from(None)
    from verl.algorithms import core_algos, turn_credit  # noqa: F401


for _registry in _WITH_BUILTINS:
    _registry.builtins_from(register_builtins)
