"""A trajectory of the search loop and what is computed from it: why it ended (``StopReason``), its tokens and masks
(``Trajectory``), a call's result and metrics (``AgentResult``), and the length budgets that can cut it
(docs/design.md, "Lengths"). The loop that makes them is ``generation.py``."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Share of a call's searches whose passages were cut to max_obs_length above which the loop warns (once).
TRUNCATED_OBS_WARN_FRAC = 0.5
# Share of a call's rows that lost a search or an answer to one length budget above which the loop warns (once
# per budget): the policy is then trained on trajectories that budget keeps from searching or answering.
LENGTH_WARN_FRAC = 0.25

# The length budgets a trajectory can be cut by (config keys, as warnings and metrics name them).
TURN_BUDGET = "data.max_response_length"
TRAJECTORY_BUDGET = "data.max_trajectory_length"
CONTEXT_BUDGET = "data.max_prompt_length"


class ActionKind(enum.Enum):
    """What one turn's output amounts to."""

    SEARCH = "search"  # an action the environment executes: a search (tags) or tool calls (hermes)
    ANSWER = "answer"
    INVALID = "invalid"  # stopped at a stop tag, but no well-formed action
    EOS = "eos"
    LENGTH = "length"


class StopReason(enum.Enum):
    """Why a trajectory ended."""

    ANSWERED = "answered"
    """The last turn ended with a well-formed ``<answer> ... </answer>``."""
    MAX_TURNS = "max_turns"
    """The final turn (after ``max_turns`` search turns) ended without an answer: it searched
    (not executed) or wrote no well-formed action."""
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
    num_searches: int = 0  # searches answered with an <information> block
    # what the environment was asked, in order: each search's query (tags), each tool call (hermes: a search's
    # query, another tool's name(arguments)); only the actions whose answer was inserted
    queries: list[str] = field(default_factory=list)
    num_invalid: int = 0  # turns that ended in no well-formed action (feedback or EOS)
    truncated_obs: int = 0  # <information> blocks cut to max_obs_length (hermes: tool results cut to their budget)
    prompt_truncated: bool = False  # the prompt was cut to max_start_length
    turns_cut: int = 0  # turns cut at max_response_length before an action (feedback followed, or the row ended)
    cut_by: str | None = None  # the budget (config key) that ended the row; set with StopReason.MAX_LENGTH
    retrieval_wait_s: float = 0.0  # seconds this row waited for its searches' passages (hermes: its tool calls)
    num_tool_calls: int = 0  # hermes: well-formed tool calls executed
    num_invalid_calls: int = 0  # hermes: tool calls answered with an error message (malformed, unknown, over the limit)
    tokenization_mismatch: int = 0  # hermes: insertions whose ids differ from a full re-render (ChatFormat.check)
    # hermes: per turn whose answer was inserted: (assistant content, the sampled end-of-turn id or None, the
    # messages inserted after it, their ids) -- the conversation the sanity check re-renders
    chat_turns: list[tuple[str, int | None, list[dict], list[int]]] = field(default_factory=list)

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

    def metrics(self) -> dict[str, float]:
        """Per-step rollout metrics, computed from the trajectories' typed fields."""
        trajs = self.trajectories
        rows = max(len(trajs), 1)
        turns = sum(t.num_turns for t in trajs)
        tokens = sum(len(t.response_ids) for t in trajs)
        inserted = sum(len(t.info_mask) - sum(t.info_mask) for t in trajs)
        metrics = {
            "agent/mean_turns": turns / rows,
            "agent/searches_per_traj": sum(t.num_searches for t in trajs) / rows,
            # turns that ended in a well-formed search or answer (or were cut by the length budget)
            "agent/valid_action_ratio": 1.0 - sum(t.num_invalid for t in trajs) / max(turns, 1),
            "agent/finish_ratio": sum(t.stop_reason is StopReason.ANSWERED for t in trajs) / rows,
            "agent/truncated_obs": float(sum(t.truncated_obs for t in trajs)),
            "agent/truncated_prompts": float(sum(t.prompt_truncated for t in trajs)),
            # rows a budget ended (searches or answers lost), and turns cut at the per-turn budget
            **{f"agent/cut/{key.split('.')[-1]}": float(n) for key, n in length_losses(trajs).items()},
            "agent/obs_tokens_per_traj": inserted / rows,
            "agent/inserted_token_frac": inserted / max(tokens, 1),
            "agent/mean_response_len": tokens / rows,
            "agent/retrieval_wait_s": sum(t.retrieval_wait_s for t in trajs) / rows,  # per trajectory
            # hermes: well-formed calls per trajectory, calls answered with an error, insertions that re-render
            # differently (0 in the tag format)
            "agent/tool_calls_per_traj": sum(t.num_tool_calls for t in trajs) / rows,
            "agent/invalid_calls": float(sum(t.num_invalid_calls for t in trajs)),
            "agent/tokenization_mismatch": float(sum(t.tokenization_mismatch for t in trajs)),
            "perf/trajectories_per_s": len(trajs) / max(self.wall_s, 1e-9),
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
