"""``checkpoint.prune`` (trainer.max_ckpt_to_keep): which checkpoints a save leaves.

Guards against a keep rule that deletes the checkpoint just written (a rerun resumed from an older one, while newer
ones of the abandoned run are still on disk), one that deletes when nothing was asked, and a deletion that a kill
can interrupt into a half directory that looks like a checkpoint. The trainers' own pruning runs in
tests/verl/trainer/test_stability.py (kill -9 with verl's key) and test_sft.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.utils import checkpoint


def committed(root: Path, *steps: int) -> None:
    for step in steps:
        (checkpoint.step_dir(root, step) / "actor").mkdir(parents=True)
        (checkpoint.step_dir(root, step) / "trainer.pt").write_bytes(b"x")


@pytest.mark.parametrize(("keep", "left"), [(None, [2, 4, 6, 8]), (1, [8]), (2, [6, 8]), (3, [4, 6, 8]),
                                            (9, [2, 4, 6, 8])])
def test_the_newest_are_kept(tmp_path, keep, left):
    committed(tmp_path, 2, 4, 6, 8)
    deleted = checkpoint.prune(tmp_path, keep, 8)
    assert checkpoint.complete_steps(tmp_path) == left
    assert sorted(deleted + left) == [2, 4, 6, 8]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"global_step_{s}" for s in left]  # nothing half-left


def test_the_checkpoint_just_written_is_never_deleted(tmp_path):
    """A rerun resumed from step 4 of a run that had reached step 8 writes step 6 again: it is the one kept, with the
    newest others up to the count."""
    committed(tmp_path, 2, 4, 6, 8)
    assert checkpoint.prune(tmp_path, 1, 6) == [2, 4, 8]
    assert checkpoint.complete_steps(tmp_path) == [6]
    committed(tmp_path, 2, 4, 8)
    assert checkpoint.prune(tmp_path, 2, 6) == [2, 4]
    assert checkpoint.complete_steps(tmp_path) == [6, 8]


def test_a_deletion_killed_halfway_leaves_nothing_resume_reads(tmp_path, monkeypatch):
    """The directory is renamed to .tmp before its files go: a kill (here: rmtree failing) after the rename leaves
    no global_step_N that resume could pick, and the next save's ``begin`` removes the rest."""
    committed(tmp_path, 2, 4)

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(tmp_path, 1, 4)
    assert checkpoint.complete_steps(tmp_path) == [4] and (tmp_path / "global_step_2.tmp").is_dir()
    monkeypatch.undo()
    checkpoint.begin(tmp_path, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_4", "global_step_5.tmp"]
