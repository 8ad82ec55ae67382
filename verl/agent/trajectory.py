"""A trajectory of the agent loop and what is computed from it: why it ended (``StopReason``), its tokens and masks
(``Trajectory``), a call's result and metrics (``AgentResult``), and the length budgets that can cut it
(docs/design.md, "Lengths"). The loop that makes them is ``verl.agent.loop``; an action format may extend
``Trajectory`` with its own counters (its ``row_type``).

Light at import (no torch): action formats import it when a config is checked."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Share of a call's rows that lost an action or an answer to one length budget above which the loop warns (once per
# budget): the policy is then trained on trajectories that budget keeps from acting or answering.
LENGTH_WARN_FRAC = 0.25

# The length budgets a trajectory can be cut by (config keys, as warnings and metrics name them).
TURN_BUDGET = "data.max_response_length"
TRAJECTORY_BUDGET = "data.max_trajectory_length"
CONTEXT_BUDGET = "data.max_prompt_length"


class ActionKind(enum.Enum):
    """What one turn's output amounts to (the action format's ``parse``)."""

    ACT = "act"  # an action the environment executes (for example a search, or tool calls)
    ANSWER = "answer"
    INVALID = "invalid"  # stopped at a stop string, but no well-formed action
    EOS = "eos"
    LENGTH = "length"


class StopReason(enum.Enum):
    """Why a trajectory ended."""

    ANSWERED = "answered"
    """The last turn ended with a well-formed answer (as the action format reads one)."""
    MAX_TURNS = "max_turns"
    """The final turn (after ``max_turns`` acting turns) ended without an answer: it acted (not executed) or
    wrote no well-formed action."""
    MAX_LENGTH = "max_length"
    """A length budget ended the row (``Trajectory.cut_by`` names it): the trajectory reached
    ``max_trajectory_length``, the final turn reached ``max_response_length`` without an action, or the
    next inserted block would have left the policy no token of trajectory budget or taken the context past
    ``max_prompt_length``."""
    EOS_WITHOUT_ANSWER = "eos_without_answer"
    """The policy emitted its end-of-sequence token without having answered."""


@dataclass
class Trajectory:
    """One row's rollout. ``stop_reason`` is None only while the loop is running."""

    prompt_ids: list[int]  # the prompt the engine saw (after the max_start_length cap)
    response_ids: list[int] = field(default_factory=list)  # sampled + inserted ids, in order
    # 1 = sampled by the policy (trained), 0 = inserted by the environment (context only)
    info_mask: list[int] = field(default_factory=list)
    # the engine's log-prob of each sampled id (0.0 on inserted ids); filled when the call asks for log-probs
    rollout_log_probs: list[float] = field(default_factory=list)
    # the policy version (trainer step) of the weights that sampled each id; -1 on inserted ids and where the
    # engine reports none (an engine outside the trainer)
    versions: list[int] = field(default_factory=list)
    stop_reason: StopReason | None = None
    num_turns: int = 0  # generation turns (engine calls that included this row)
    num_invalid: int = 0  # turns that ended in no well-formed action (feedback or EOS)
    prompt_truncated: bool = False  # the prompt was cut to max_start_length
    turns_cut: int = 0  # turns cut at max_response_length before an action (feedback followed, or the row ended)
    cut_by: str | None = None  # the budget (config key) that ended the row; set with StopReason.MAX_LENGTH
    env_wait_s: float = 0.0  # seconds this row waited for its environment's answers (TurnContext.call)

    def append(self, ids: list[int], sampled: bool, log_probs: list[float] | None = None,
               versions: list[int] | None = None) -> None:
        self.response_ids.extend(ids)
        self.info_mask.extend([1 if sampled else 0] * len(ids))
        self.rollout_log_probs.extend(log_probs if log_probs is not None else [0.0] * len(ids))
        self.versions.extend(versions if versions is not None else [-1] * len(ids))

    def version_range(self) -> tuple[int, int]:
        """(oldest, newest) policy version among the sampled ids; (-1, -1) when none is known."""
        known = [v for v in self.versions if v >= 0]
        return (min(known), max(known)) if known else (-1, -1)


@dataclass
class AgentResult:
    trajectories: list[Trajectory]
    wall_s: float = 0.0  # the whole run
    schedule: dict[str, float] = field(default_factory=dict)  # the schedule's counters (async: engine calls ...)
    format_metrics: dict[str, float] = field(default_factory=dict)  # the action format's (ActionFormat.metrics)

    def metrics(self) -> dict[str, float]:
        """Per-step rollout metrics, computed from the trajectories' typed fields, then the format's own."""
        trajs = self.trajectories
        rows = max(len(trajs), 1)
        turns = sum(t.num_turns for t in trajs)
        tokens = sum(len(t.response_ids) for t in trajs)
        inserted = sum(len(t.info_mask) - sum(t.info_mask) for t in trajs)
        metrics = {
            "agent/mean_turns": turns / rows,
            "agent/turns": float(turns),  # the step's generation turns: the valid-action share's denominator
            # turns that ended in a well-formed action or answer (or were cut by the length budget)
            "agent/valid_action_ratio": 1.0 - sum(t.num_invalid for t in trajs) / max(turns, 1),
            "agent/finish_ratio": sum(t.stop_reason is StopReason.ANSWERED for t in trajs) / rows,
            "agent/truncated_prompts": float(sum(t.prompt_truncated for t in trajs)),
            # rows a budget ended (actions or answers lost), and turns cut at the per-turn budget
            **{f"agent/cut/{key.split('.')[-1]}": float(n) for key, n in length_losses(trajs).items()},
            "agent/obs_tokens_per_traj": inserted / rows,
            "agent/inserted_token_frac": inserted / max(tokens, 1),
            "agent/mean_response_len": tokens / rows,
            "perf/trajectories_per_s": len(trajs) / max(self.wall_s, 1e-9),
            **self.format_metrics,
            **self.schedule,
        }
        for reason in StopReason:
            metrics[f"agent/stop/{reason.value}"] = float(sum(t.stop_reason is reason for t in trajs))
        return metrics


def length_losses(trajs: list[Trajectory]) -> dict[str, int]:
    """Per length budget (config key): rows it ended plus, for the per-turn budget, turns it cut."""
    losses = dict.fromkeys((TURN_BUDGET, TRAJECTORY_BUDGET, CONTEXT_BUDGET), 0)
    for t in trajs:
        if t.cut_by is not None:
            losses[t.cut_by] += 1
        if t.cut_by != TURN_BUDGET:
            losses[TURN_BUDGET] += t.turns_cut
    return losses
