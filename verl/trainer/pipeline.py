"""How a step's batch is produced: when, with which weights (the bounded off-policy pipeline,
``trainer.max_staleness``), and from how many rounds of generation (dynamic sampling,
``algorithm.filter_groups``). Whatever produced it, a step's batch arrives as one ``Generated``: the scored batch,
every prompt drawn for it, its generation metrics, the seconds it took and the loader's position after it.

The pipeline. Versions: the engines hold the weights of policy version ``v`` = the last trainer step whose weights
were synced into them (``GroupRollout.version``; 0 = the initial or resumed policy). Every sampled token records
its version (``GenerationOutput.versions``); the recipe reports each row's oldest and newest (``min_version`` /
``max_version``). Step ``s`` trains the policy of version ``s - 1`` (every step ends with the sync of its weights,
or with an unchanged policy renamed ``s``), so a row's staleness at step ``s`` is ``s - 1 - min_version``.

* ``max_staleness: 0`` (``InlineRollout``): step ``s`` draws its batch and generates it after step ``s - 1``'s
  sync, in the trainer's thread: today's order, staleness 0.
* ``max_staleness: k >= 1`` (``PipelinedRollout``): a producer thread draws batches and generates them while the
  trainer trains. It starts batch ``s'`` only once the engines hold version ``>= s' - 1 - k``, so every token of
  it is at most ``k`` versions behind the policy that trains on it: with ``k = 1``, batch ``s + 1`` is generated
  during step ``s``'s training, with the weights from before step ``s``'s update ("one step off").
  At a weight sync, rows in flight either finish on the weights they started with (``rollout.partial: false``:
  the sync waits for the batch being generated) or continue on the new weights (``partial: true``: the sync
  waits only for the engine calls running, and later tokens record the new version).
  The bound is checked again when a batch is taken: a batch holding a row more than ``k`` versions behind is
  dropped, counted (``rollout/dropped_stale``, rows) and generated again on the current weights.
  The loss is off-policy by up to ``k`` versions: the actor corrects with the engines' log-probs of the sampled
  tokens (the behaviour policy) by truncated importance sampling (``actor.tis_cap``, required here).

Crash safety: a checkpoint stores the data loader's position after the last TRAINED batch (``loader_state``), so
batches generated ahead and not trained are not saved; a resumed run draws and generates them again (never lost,
never trained twice). An error in the producer (an outage of the retrieval service) reaches the trainer when it
takes the batch that failed, as it would have in the inline order.

Metrics per step: ``rollout/staleness_mean`` / ``_max`` (over the batch's rows), ``rollout/dropped_stale``,
``perf/overlap_s`` (seconds in which the producer generated while the trainer thread trained this step),
``timing/wait_rollout`` (seconds the trainer waited for its batch).

Dynamic sampling (DAPO): groups whose samples all scored the same are dropped and more are generated.

With a group estimator (GRPO, RLOO, ...) a group in which every sample of a prompt has the same score gets zero
advantage on every token: it adds nothing to the policy gradient and only dilutes the batch (early in training
most groups are all wrong, late most are all right). ``algorithm.filter_groups.enable`` (verl's key names) keeps
only the groups whose scores differ and generates further rounds of ``data.train_batch_size`` prompts until
``data.train_batch_size`` kept groups are collected or ``algorithm.filter_groups.max_num_gen_batches`` rounds
have run.

Choices:
- Where it runs: inside the function that makes a step's batch (``PPOTrainer._make_batch``), which the rollout
  above calls; with ``trainer.max_staleness >= 1`` that is the producer thread, so extra rounds are
  generated while the trainer trains on the previous batch instead of stalling it. Rewards are computed there too
  (the filter needs them). The loader position saved with a step is the one after its last round, so a resumed run
  draws the prompts after them: no prompt is trained twice; the kept groups beyond the batch are dropped (as
  verl's DAPO recipe does), like the zero-variance ones.
- Equal means exactly equal (``max == min`` of the group's ``score``, the sequence reward before KL), so a group
  dropped is a group whose advantages would be exactly 0.
- The batch keeps its size: if the last round leaves it short, the remaining places are filled with dropped groups
  of the rounds, in generation order, and counted (``train/filled_groups``). They cost compute and contribute no
  policy gradient, as without filtering; training never stops for it.
- Rounds after the first sample with their own seeds (``round_seed``): a resumed run samples the same.
- Group ids (``uid``) of later rounds get a ``#round`` suffix so that a prompt drawn twice in one step (a small
  dataset wrapping around) is two groups, not one.

Metrics: ``train/gen_rounds`` (rounds this step), ``train/kept_group_frac`` (groups with differing scores / groups
generated, over all rounds), ``train/filled_groups``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from verl.protocol import Batch
from verl.trainer import columns
from verl.utils.dataset import StatefulLoader

logger = logging.getLogger(__name__)


@dataclass
class Generated:
    """A step's generated, scored batch, with what the trainer needs to log, train and checkpoint it.

    The generate function fills the first three fields (``PPOTrainer.generate``: one round; ``fill_batch``: the
    rounds of dynamic sampling); the rollout that ran it adds the last two (``InlineRollout``,
    ``PipelinedRollout``)."""

    batch: Batch  # generated and scored
    prompts: Batch  # every prompt drawn for it (to generate again)
    metrics: dict[str, float] = field(default_factory=dict)  # the recipe's and the engines' (first round), train/*
    seconds: float = 0.0  # generating and scoring it, every round (timing/gen)
    loader_state: dict = field(default_factory=dict)  # the loader's position right after its last prompts were drawn


# (batch of prompts, step index whose sampling seed it uses, draw: the next batch of prompts from the same stream,
# for a step that needs more than one, see dynamic sampling below) -> the generated batch
GenerateFn = Callable[[Batch, int, Callable[[], Batch]], Generated]


def staleness(batch: Batch, trained_version: int) -> np.ndarray:
    """Per row: versions between the policy being trained and the row's oldest sampled token (0 when unknown)."""
    oldest = np.asarray(batch["min_version"], dtype=np.int64) if "min_version" in batch else \
        np.full(len(batch), -1)
    return np.where(oldest >= 0, trained_version - oldest, 0)


class InlineRollout:
    """``max_staleness: 0``: draw and generate in the caller's thread when the batch is taken."""

    max_staleness = 0

    def __init__(self, loader: StatefulLoader, generate: GenerateFn):
        self.loader = loader
        self.generate = generate
        self._batches = _endless(loader)

    def take(self, step: int) -> Generated:
        start = time.perf_counter()
        made = self.generate(next(self._batches), step, lambda: next(self._batches))
        return replace(made, seconds=time.perf_counter() - start, loader_state=self.loader.state_dict())

    @contextlib.contextmanager
    def weights_update(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        yield

    def overlap_s(self, start: float, end: float) -> float:
        return 0.0

    def close(self) -> None:
        pass


class PipelinedRollout:
    """``max_staleness: k >= 1``: a producer thread generates ahead (module docstring)."""

    def __init__(self, loader: StatefulLoader, generate: GenerateFn, first_step: int, last_step: int,
                 max_staleness: int, partial: bool, version: Callable[[], int]):
        self.loader = loader
        self.generate = generate
        self.max_staleness = max_staleness
        self.partial = partial
        self.version = version  # the engines' current version
        self.last_step = last_step
        self._next = first_step  # the next step whose batch the producer generates
        self._cond = threading.Condition()
        self._ready: dict[int, Generated | BaseException] = {}
        self._busy = False  # generating a batch now
        self._busy_since = 0.0
        self._hold = 0  # >0: the producer must not start a new batch (a sync or a validation is waiting)
        self._stop = False
        self._intervals: list[tuple[float, float]] = []  # producer generation intervals (for perf/overlap_s)
        self._batches = _endless(loader)
        self._thread = threading.Thread(target=self._produce, name="rollout-producer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producer
    def _may_start(self) -> bool:
        ahead = self._next - 1 - self.version()  # the versions its oldest token would be behind when trained
        return self._stop or (self._hold == 0 and self._next <= self.last_step and ahead <= self.max_staleness
                              and not any(isinstance(v, BaseException) for v in self._ready.values()))

    def _produce(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(self._may_start)
                if self._stop:
                    return
                step, self._next, self._busy = self._next, self._next + 1, True
                self._busy_since = start = time.perf_counter()
            try:
                made = self.generate(next(self._batches), step, lambda: next(self._batches))
                loader_state = self.loader.state_dict()
                result: Generated | BaseException = replace(made, seconds=time.perf_counter() - start,
                                                            loader_state=loader_state)
            except BaseException as err:  # noqa: BLE001 - handed to the trainer when it takes this step
                result = err
            end = time.perf_counter()
            with self._cond:
                self._intervals.append((start, end))
                self._ready[step] = result
                self._busy = False
                self._cond.notify_all()

    # ------------------------------------------------------------------ trainer side
    def take(self, step: int) -> Generated:
        """The batch of ``step`` (waits for it); re-raises the producer's error for it."""
        with self._cond:
            self._cond.wait_for(lambda: step in self._ready)
            result = self._ready.pop(step)
            self._cond.notify_all()
        if isinstance(result, BaseException):
            raise result
        return result

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """No batch is being generated inside (the one in flight ends first; no new one starts)."""
        with self._cond:
            self._hold += 1
            self._cond.wait_for(lambda: not self._busy)
        try:
            yield
        finally:
            with self._cond:
                self._hold -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def weights_update(self) -> Iterator[None]:
        """Around a sync: with ``partial`` nothing to wait for here (the engines' own guard waits for the running
        calls), else the batch in flight finishes on its weights first."""
        if self.partial:
            try:
                yield
            finally:
                with self._cond:
                    self._cond.notify_all()  # a new version may let the producer start
            return
        with self.quiet():
            yield

    def overlap_s(self, start: float, end: float) -> float:
        """Seconds of [start, end] during which the producer was generating."""
        with self._cond:
            intervals = list(self._intervals) + ([(self._busy_since, end)] if self._busy else [])
        total = sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)
        return min(total, end - start)

    def close(self) -> None:
        """Stop the producer after the batch it is generating (that batch is discarded)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()


def bound_staleness(rollout: InlineRollout | PipelinedRollout, generated: Generated, trained_version: int,
                    regenerate: Callable[[Batch], Generated]) -> tuple[Generated, dict[str, float]]:
    """The staleness bound on a batch about to train the policy of ``trained_version``: a batch holding a row more
    than ``rollout.max_staleness`` versions behind is dropped and ``regenerate``d from its prompts on the current
    weights, once the producer's batch in flight has ended (the batch and its metrics replaced; the loader position
    and ``timing/gen`` stay the first generation's). Returns the batch to train on and its metrics:
    ``rollout/staleness_mean``, ``rollout/staleness_max`` and ``rollout/dropped_stale`` (rows dropped)."""
    dropped, max_staleness = 0, rollout.max_staleness
    stale = staleness(generated.batch, trained_version)
    if stale.max(initial=0) > max_staleness:
        logger.warning("%d rows are more than trainer.max_staleness=%d versions behind policy version %d: generating "
                       "the batch again", int((stale > max_staleness).sum()), max_staleness, trained_version)
        dropped = len(generated.batch)
        with rollout.quiet():
            again = regenerate(generated.prompts)
        generated = replace(generated, batch=again.batch, metrics=again.metrics)
        stale = staleness(generated.batch, trained_version)
    return generated, {"rollout/staleness_mean": float(stale.mean()), "rollout/staleness_max": float(stale.max()),
                       "rollout/dropped_stale": float(dropped)}


def _endless(loader: StatefulLoader) -> Iterator[Batch]:
    while True:
        yield from loader


# ------------------------------------------------------------------ dynamic sampling (DAPO)
PROMPT_COLUMNS = ("prompts",)  # [B, P], left-padded
FULL_COLUMNS = ("input_ids", "attention_mask", "position_ids")  # [B, P + R]: prompt then response


def round_seed(seed: int, round_index: int) -> int:
    """The sampling seed of round ``round_index`` (0 = the step's own seed, unchanged)."""
    return seed + 1_000_003 * round_index


def constant_groups(uids: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per row: True when every row of its group (same uid) has exactly the same score. ``[B] -> [B]`` bool."""
    uids = np.asarray(uids)
    scores = np.asarray(scores, dtype=np.float64)
    out = np.zeros(len(uids), dtype=bool)
    for uid in dict.fromkeys(uids.tolist()):
        rows = uids == uid
        group = scores[rows]
        out[rows] = group.max() == group.min()
    return out


def group_starts(uids: np.ndarray) -> list[np.ndarray]:
    """Row indices of each group, groups in order of first appearance (rows of a group are consecutive after
    ``Batch.repeat``, but this does not rely on it)."""
    uids = np.asarray(uids)
    return [np.flatnonzero(uids == uid) for uid in dict.fromkeys(uids.tolist())]


def concat_trajectories(batches: list[Batch], pad_id: int) -> Batch:
    """Rows of generated batches with different widths ``P`` and ``R``, re-padded to the widest: prompts left,
    responses right (``pad_id`` in id columns, 0 elsewhere); ``position_ids`` recomputed from the attention mask as
    ``pack_trajectories`` makes them. Columns that are not ``[B, P]``/``[B, P+R]`` and 2-D are ``[B, R]``."""
    if len(batches) == 1:
        return batches[0]
    P = max(b["prompts"].shape[1] for b in batches)
    R = max(b["responses"].shape[1] for b in batches)
    ids = {"prompts", "responses", "input_ids"}

    def pad(x: torch.Tensor, left: int, right: int, name: str) -> torch.Tensor:
        return torch.nn.functional.pad(x, (left, right), value=pad_id if name in ids else 0)

    parts = []
    for b in batches:
        p, r = b["prompts"].shape[1], b["responses"].shape[1]
        tensors = {}
        for name, x in b.tensors.items():
            if x.dim() != 2:
                tensors[name] = x
            elif name in PROMPT_COLUMNS:
                tensors[name] = pad(x, P - p, 0, name)
            elif name in FULL_COLUMNS:
                tensors[name] = torch.cat([pad(x[:, :p], P - p, 0, name), pad(x[:, p:], 0, R - r, name)], dim=1)
            else:
                tensors[name] = pad(x, 0, R - r, name)
        if "position_ids" in tensors:
            tensors["position_ids"] = (tensors["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
        parts.append(Batch(tensors, b.non_tensors, b.meta))
    return Batch.concat(parts)


def fill_batch(first: Batch, draw: Callable[[], Batch], generate: Callable[[Batch, int], Generated], groups: int,
               max_rounds: int, pad_id: int) -> Generated:
    """Generate (and score) rounds of prompts, keeping the groups whose scores differ, until ``groups`` are kept or
    ``max_rounds`` rounds ran; the batch then has exactly ``groups`` groups (module docstring).

    ``first`` is the step's drawn prompts; ``draw()`` draws the next ``data.train_batch_size`` prompts;
    ``generate(prompts, round)`` returns their generated, scored rows (column ``score``, groups by ``uid``) and
    that round's generation metrics. Returns the batch, every prompt drawn, and the first round's generation
    metrics with ``train/gen_rounds``, ``train/kept_group_frac`` and ``train/filled_groups``.
    """
    kept: list[Batch] = []
    dropped: list[Batch] = []
    drawn = [first]
    n_kept = n_generated = rounds = 0
    prompts = first
    gen_metrics: dict[str, float] | None = None
    while True:
        made = generate(prompts, rounds)
        out = columns.require(made.batch, "dynamic_sampling")
        gen_metrics = made.metrics if gen_metrics is None else gen_metrics  # the first round's
        if rounds:
            columns.write(out, "dynamic_sampling", uid=np.array([f"{u}#{rounds}" for u in out["uid"]], dtype=object))
        rounds += 1
        constant = constant_groups(out["uid"], out["score"])
        for rows in group_starts(out["uid"]):
            (dropped if constant[rows[0]] else kept).append(out.index(rows))
        n_generated += len(group_starts(out["uid"]))
        n_kept = len(kept)
        if n_kept >= groups or rounds >= max_rounds:
            break
        prompts = draw()
        drawn.append(prompts)
    filled = max(0, groups - n_kept)
    chosen = kept[:groups] + dropped[:filled]
    metrics = {**gen_metrics, "train/gen_rounds": float(rounds), "train/kept_group_frac": n_kept / max(n_generated, 1),
               "train/filled_groups": float(filled)}
    return Generated(concat_trajectories(chosen, pad_id), Batch.concat(drawn), metrics)
