"""Which batch is generated when, and with which weights: the bounded off-policy pipeline (``trainer.max_staleness``).

Versions: the engines hold the weights of policy version ``v`` = the last trainer step whose weights were synced
into them (``GroupRollout.version``; 0 = the initial or resumed policy). Every sampled token records its version
(``GenerationOutput.versions``); the recipe reports each row's oldest and newest (``min_version`` /
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
``perf/wait_rollout_s`` (seconds the trainer waited for its batch).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from verl.protocol import Batch
from verl.utils.dataset import StatefulLoader

# (batch of prompts, step index whose sampling seed it uses, draw: the next batch of prompts from the same stream,
# for a step that needs more than one, see dynamic_sampling.py) -> the generated batch
GenerateFn = Callable[[Batch, int, Callable[[], Batch]], "Made"]


@dataclass
class Made:
    """What the generate function returns: the generated batch and every prompt drawn for it."""

    batch: Batch
    prompts: Batch


@dataclass
class Generated:
    """A generated batch with what the trainer needs to train and checkpoint it."""

    step: int
    prompts: Batch  # every prompt drawn for it (to generate again)
    batch: Batch  # generated
    loader_state: dict  # the loader's position right after its last prompts were drawn
    started: float  # perf_counter when its generation began / ended
    ended: float


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
        return Generated(step, made.prompts, made.batch, self.loader.state_dict(), start, time.perf_counter())

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
                result: Generated | BaseException = Generated(step, made.prompts, made.batch,
                                                              self.loader.state_dict(), start, 0.0)
            except BaseException as err:  # noqa: BLE001 - handed to the trainer when it takes this step
                result = err
            end = time.perf_counter()
            with self._cond:
                if isinstance(result, Generated):
                    result.ended = end
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


def _endless(loader: StatefulLoader) -> Iterator[Batch]:
    while True:
        yield from loader
