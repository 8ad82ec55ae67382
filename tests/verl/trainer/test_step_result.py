"""A step's typed results (``step_metrics.StepResult`` / ``StepTimings``, ``pipeline.Generated``).

Guards against metrics and timings that travel in dicts a callee fills (``batch.meta["filter_metrics"]``,
``meta["gen_metrics"]``, a ``timing`` dict handed down to every phase): shipped to every worker with each batch,
lost or mixed up when batches are joined, and unreadable from a signature; and against a rollout that hands over a
batch with another step's metrics or loader position (the pipelined producer runs ahead while the trainer takes
an earlier step).
"""

from __future__ import annotations

import ast
from pathlib import Path

from verl.protocol import Batch
from verl.trainer.pipeline import Generated, InlineRollout, PipelinedRollout
from verl.trainer.step_metrics import StepTimings
from verl.utils.dataset import StatefulLoader

ROOT = Path(__file__).resolve().parents[3]


class Rows:
    """A dataset of 8 prompts (what ``StatefulLoader`` reads of ``PromptDataset``)."""

    def __len__(self) -> int:
        return 8

    def batch(self, rows) -> Batch:
        return Batch(non_tensors={"index": list(rows)})


def generate(prompts: Batch, step: int, draw) -> Generated:
    """A step's batch from two draws (as dynamic sampling makes one), its metrics naming the step."""
    more = draw()
    drawn = Batch.concat([prompts, more])
    return Generated(drawn, drawn, {"agent/step": float(step), "agent/rows": float(len(drawn))})


def test_a_rollout_hands_over_each_step_with_its_own_metrics_and_loader_position():
    """Inline and pipelined (the producer one step ahead): step s's batch carries step s's metrics and the loader's
    position right after step s's draws, not after a later step's."""
    for make in (lambda loader: InlineRollout(loader, generate),
                 lambda loader: PipelinedRollout(loader, generate, first_step=1, last_step=3, max_staleness=2,
                                                 partial=False, version=lambda: 0)):
        loader = StatefulLoader(Rows(), batch_size=2, shuffle=False, seed=0)
        rollout = make(loader)
        try:
            taken = [rollout.take(step) for step in (1, 2, 3)]
        finally:
            rollout.close()
        assert [g.metrics for g in taken] == [{"agent/step": float(s), "agent/rows": 4.0} for s in (1, 2, 3)]
        assert [g.loader_state for g in taken] == [{"epoch": 0, "position": 2}, {"epoch": 0, "position": 4},
                                                   {"epoch": 1, "position": 2}]
        assert [list(g.prompts["index"]) for g in taken] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
        assert all(g.batch.meta == {} and g.seconds >= 0 for g in taken)


def test_step_timings_log_the_phases_that_ran():
    timings = StepTimings(gen=2.0, adv=0.5, step=3.0)
    timings.update_actor = 1.0
    assert timings.metrics() == {"timing/gen": 2.0, "timing/adv": 0.5, "timing/update_actor": 1.0,
                                 "timing/step": 3.0}
    assert timings.phases() == {"gen": 2.0, "adv": 0.5, "update_actor": 1.0, "step": 3.0}


SEAM = 'out.meta.pop(\'gen_metrics\', {})'  # the recipe's generation metrics, taken off its batch (recipe seam)


def test_no_phase_fills_a_dict_it_was_handed():
    """In the trainer (verl/trainer/) no code reads, writes or replaces ``Batch.meta`` entries (a batch's meta is
    only passed along) but the one place that takes the recipe's ``gen_metrics`` off its batch, and no function
    takes a ``timing`` dict to fill: each phase returns its metrics, its seconds measured where it runs."""
    offenders = []
    for path in sorted((ROOT / "verl" / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            is_meta = lambda n: isinstance(n, ast.Attribute) and n.attr == "meta"  # noqa: E731
            if isinstance(node, ast.Subscript) and is_meta(node.value) or \
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_meta(node.func.value):
                if ast.unparse(node) != SEAM:
                    offenders.append(f"{where}: {ast.unparse(node)}")
            if isinstance(node, ast.Assign) and any(is_meta(t) for t in node.targets):
                offenders.append(f"{where}: {ast.unparse(node)}")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                offenders += [f"{where}: {node.name}({a.arg})" for a in node.args.args if a.arg == "timing"]
    assert not offenders, offenders
