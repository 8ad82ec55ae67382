"""A refused command changes nothing on disk: every start-up check of the trainer comes before its first write.

Guards against issue 57's item 8: a resume refused for a damaged checkpoint had already rewritten the run
directory's ``config.yaml`` (the new ``trainer.default_local_dir`` and ``total_training_steps``), and a start refused
because the retrieval service does not answer had already created the run directory with a ``config.yaml`` in it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from retrieval_server.launcher import free_port
from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import TRAINED_STEPS, copy_run, overrides, trained_run_args

pytestmark = pytest.mark.slow  # starts trainers: not in `make test-fast`


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` by relative path: a file's sha256, "dir" for a directory."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def test_a_refused_resume_leaves_every_file_of_the_run_directory_byte_identical(workspace, trained_run, tmp_path):
    """A copy of the shared trained run as a kill after step 2's checkpoint leaves it, that checkpoint's shard then
    cut short; the rerun (another directory path and step budget, both keys a rerun may change, so the config it
    would record differs) is refused with exit 2 and every file and directory is as it was."""
    out = copy_run(trained_run, tmp_path / "run", 2)
    (shard,) = (out / "global_step_2" / "actor").glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:10_000])
    before = tree(out)
    done = main_ppo_in_process(*trained_run_args(workspace, out, TRAINED_STEPS + 2))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"checkpoint {out / 'global_step_2'} is incomplete or corrupt" in done.stderr
    assert tree(out) == before


def test_a_start_refused_for_a_silent_service_creates_no_run_directory(workspace, tmp_path):
    """With search on and no service at retriever.url the start is refused (exit 2) before the run directory
    exists."""
    out = tmp_path / "run"
    done = main_ppo_in_process(*overrides(workspace, out, 1, "do_search=true",
                                          f"retriever.url=http://127.0.0.1:{free_port()}"))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "retrieval service not answering" in done.stderr
    assert not out.exists()
