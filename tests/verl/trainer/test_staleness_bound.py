"""The staleness bound (``pipeline.bound_staleness``) on hand-made batches: what is measured, what is dropped.

Guards against: a batch holding a row more than ``max_staleness`` versions behind trained on anyway; a batch within
the bound generated again (a wasted generation, and the producer stopped for it); the regenerated batch keeping the
dropped batch's metrics or losing the first generation's loader position and seconds; the producer left running
while a dropped batch is generated again. The bound through the real pipeline: ``test_pipeline.py``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from verl.protocol import Batch
from verl.trainer.pipeline import Generated, bound_staleness


class Rollout:
    """The two things ``bound_staleness`` asks of a rollout: its bound, and ``quiet()`` (recorded)."""

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self.quiet_now = False
        self.quiet_calls = 0

    @contextlib.contextmanager
    def quiet(self):
        self.quiet_now, self.quiet_calls = True, self.quiet_calls + 1
        yield
        self.quiet_now = False


def made(min_versions: list[int], tag: str) -> Generated:
    rows = len(min_versions)
    batch = Batch(non_tensors={"min_version": np.array(min_versions), "tag": [tag] * rows})
    return Generated(batch, Batch(non_tensors={"prompt": [f"p{i}" for i in range(rows)]}), {"gen/tag": 1.0},
                     seconds=12.5, loader_state={"position": 7})


def test_a_batch_within_the_bound_is_trained_as_generated():
    """Rows 0 and 1 versions behind policy 3 under max_staleness 1 (an unknown version, -1, counts as 0)."""
    rollout, first = Rollout(1), made([3, 2, -1, 2], "first")
    out, metrics = bound_staleness(rollout, first, 3, regenerate=lambda prompts: pytest.fail("generated again"))
    assert out is first and rollout.quiet_calls == 0
    assert metrics == {"rollout/staleness_mean": 0.5, "rollout/staleness_max": 1.0, "rollout/dropped_stale": 0.0}


@pytest.mark.parametrize("max_staleness, min_versions", [(1, [3, 1, 3]), (0, [2, 3, 3])])
def test_a_row_past_the_bound_drops_the_whole_batch_and_generates_it_again(max_staleness, min_versions):
    """One row 2 (1) versions behind under max_staleness 1 (0): every row is dropped, the same prompts generated
    again with the producer quiet; the new batch and its metrics are trained, with the first generation's loader
    position and seconds."""
    rollout, first = Rollout(max_staleness), made(min_versions, "first")
    asked = []

    def regenerate(prompts: Batch) -> Generated:
        assert rollout.quiet_now, "generated again while the producer runs"
        asked.append(list(prompts["prompt"]))
        again = made([3] * len(prompts), "again")
        again.metrics = {"gen/tag": 2.0}
        return again

    out, metrics = bound_staleness(rollout, first, 3, regenerate)
    assert asked == [["p0", "p1", "p2"]] and rollout.quiet_calls == 1
    assert list(out.batch["tag"]) == ["again"] * 3 and out.metrics == {"gen/tag": 2.0}
    assert out.seconds == 12.5 and out.loader_state == {"position": 7} and out.prompts is first.prompts
    assert metrics == {"rollout/staleness_mean": 0.0, "rollout/staleness_max": 0.0, "rollout/dropped_stale": 3.0}
