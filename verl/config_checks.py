"""Checks that walk the config whole rather than key by key (called by ``verl.config.validate``).

Choices:
- **Every number finite.** One walk over the typed config's fields (and the values of mapping fields such as
  ``reward.terms``) refuses NaN and +-Inf wherever a float is allowed: an infinite learning rate passed the old
  ``lr > 0`` check and trained a model whose every weight became NaN. ``RANGES`` then bounds the numbers that have a
  range where they mean something (a learning rate above 1, a temperature above 10); each error names the key and
  the range.
- **The retriever URL list is parsed whole**: every comma-separated entry must be ``http(s)://HOST[:PORT][/PATH]``
  or ``ray://NAME``; a ``;`` (or any other separator), a bad port, a query string or an empty host is named with
  the entry, before the client ever sends a request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

# key -> (lowest, highest, whether lowest itself is allowed, what the key is): checked after the finiteness walk.
RANGES: dict[str, tuple[float, float, bool, str]] = {
    "actor_rollout_ref.actor.optim.lr": (0.0, 1.0, False, "a learning rate (AdamW; typical 1e-6 .. 1e-5)"),
    "critic.optim.lr": (0.0, 1.0, False, "a learning rate (AdamW; typical 1e-6 .. 1e-5)"),
    "actor_rollout_ref.actor.optim.weight_decay": (0.0, 1.0, True, "a decoupled weight decay"),
    "critic.optim.weight_decay": (0.0, 1.0, True, "a decoupled weight decay"),
    "actor_rollout_ref.rollout.temperature": (0.0, 10.0, True, "a sampling temperature (0 = greedy)"),
    "actor_rollout_ref.rollout.val_kwargs.temperature": (0.0, 10.0, True, "a sampling temperature (0 = greedy)"),
    "actor_rollout_ref.actor.clip_ratio": (0.0, 1.0, False, "PPO's clip range epsilon (ratio kept in 1 +- eps)"),
    "actor_rollout_ref.actor.clip_ratio_high": (0.0, 10.0, False, "the upper clip range (DAPO's clip-higher)"),
    "actor_rollout_ref.actor.clip_ratio_c": (1.0, 1000.0, False, "dual-clip PPO's bound on negative advantages"),
    "actor_rollout_ref.actor.grad_clip": (0.0, math.inf, False, "a gradient-norm bound (null = none)"),
    "critic.grad_clip": (0.0, math.inf, False, "a gradient-norm bound (null = none)"),
    "critic.cliprange_value": (0.0, math.inf, False, "the value clip range"),
    "actor_rollout_ref.model.lora_alpha": (0.0, math.inf, False, "LoRA's scale numerator"),
    "algorithm.kl_ctrl.target_kl": (0.0, math.inf, False, "the adaptive controller's target KL"),
    "algorithm.turn_reward_coef": (0.0, math.inf, True, "a coefficient"),
    "algorithm.turn_adv_coef": (0.0, math.inf, True, "a coefficient"),
    "actor_rollout_ref.rollout.cpu_kv_cache_gb": (0.0, math.inf, False, "GiB of KV cache"),
    "reward.judge.timeout_s": (0.0, math.inf, False, "seconds"),
    "trainer.ray_timeout_s": (0.0, math.inf, False, "seconds"),
    "trainer.max_skipped_share": (0.0, 1.0, False, "a share of the steps"),
}


def _numbers(node: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every float in the config tree ``node`` (dataclasses, and the values of mappings)."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            yield from _numbers(getattr(node, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(value, f"{prefix}.{key}")
    elif isinstance(node, float):
        yield prefix, node


def check_finite(cfg: Any, error: type[Exception]) -> None:
    """Every float of ``cfg`` is finite; ``error`` naming the key otherwise."""
    for key, value in _numbers(cfg):
        if not math.isfinite(value):
            raise error(f"config key {key}={value} is invalid: allowed a finite number (not nan or inf)")


def check_ranges(cfg: Any, error: type[Exception]) -> None:
    """Each key of ``RANGES`` lies in its range (after ``validate``'s own checks, whose messages a value below a
    bound they check gets); ``error`` naming the key and the range otherwise."""
    for key, (low, high, low_ok, what) in RANGES.items():
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        if node is None:
            continue
        if not ((low <= node if low_ok else low < node) and node <= high):
            bounds = f"{'[' if low_ok else '('}{low:g}, {high:g}]" if math.isfinite(high) else \
                f"{'>=' if low_ok else '>'} {low:g}"
            raise error(f"config key {key}={node!r} is invalid: allowed {what}, a number "
                        f"{'in ' if math.isfinite(high) else ''}{bounds}")


def url_problem(entry: str) -> str | None:
    """Why ``entry`` (one endpoint of ``retriever.url``) is not ``http(s)://HOST[:PORT][/PATH]`` or ``ray://NAME``;
    None when it is."""
    if any(c in entry for c in ";| \t\n"):
        return "separate endpoints with commas (no ';', '|' or spaces)"
    if entry.startswith("ray://"):
        name = entry[len("ray://"):].rstrip("/")
        return None if name and "/" not in name and ":" not in name else "ray://NAME names a deployment: one word"
    try:
        parts = urlsplit(entry)
        port = parts.port
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http://, https:// or ray://"
    if not parts.hostname:
        return "no host"
    if parts.query or parts.fragment:
        return "a base URL takes no ?query or #fragment"
    if port == 0:
        return "port 0 is not a port a service listens on"
    return None


def check_retriever_url(url: str, error: type[Exception]) -> None:
    """``retriever.url``: one or more comma-separated endpoints, each well formed (``url_problem``)."""
    entries = [part.strip() for part in url.split(",")]
    allowed = ("an http:// or https:// URL of the retrieval service, e.g. http://127.0.0.1:8000, several (shards, "
               "replicas) separated by commas, or ray://NAME for the deployment NAME started by python -m "
               "retrieval_server.ray_service up")
    if not any(entries):
        raise error(f"config key retriever.url={url!r} is invalid: allowed {allowed}")
    for entry in entries:
        problem = "an empty entry between commas" if not entry else url_problem(entry)
        if problem:
            raise error(f"config key retriever.url={url!r} is invalid: {entry!r}: {problem}; allowed {allowed}")
