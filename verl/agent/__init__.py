"""The generic multi-turn agent loop: a policy acts, an environment answers, until the trajectory ends.

What a task plugs in is its action format (``verl.agent.format.ActionFormat``: how a turn's text becomes an action,
and what the environment inserts after it), registered by name (``verl.tools.register_format``, the config key
``actor_rollout_ref.rollout.multi_turn.format``). The loop (``loop.AgentLoop``: turns, length budgets, masks, the
sync and async schedules of ``scheduler``) knows no task. ``trajectory`` holds what a rollout returns.

Importing this package (and ``format``, ``trajectory``) is light (no torch): a task's format module registers itself
when the config is checked. ``loop`` and ``scheduler`` import the engines' types.
"""
