"""Checkpoint directories: ``<default_local_dir>/global_step_<N>/`` written atomically.

Layout of one checkpoint:

    global_step_N/actor/        written by the actor workers (model, optimizer, scheduler)
    global_step_N/critic/       written by the critic workers (when there is a critic)
    global_step_N/trainer.pt    step, dataloader position, KL controller, Python/NumPy/torch RNG states
    global_step_N/config.yaml   the resolved config of the run

Choices: everything is written into ``global_step_N.tmp`` and renamed at the end: the rename is
the commit (atomic on one file system), so a directory named ``global_step_N`` is complete and a
kill at any moment leaves at worst a ``.tmp`` directory, which ``resume_mode=auto`` never reads and
the next save deletes. ``find_latest`` scans for the newest complete directory instead of trusting
``latest_checkpointed_iteration.txt`` (verl's marker, still written last, atomically, for tools
that read it): a kill between a rename and the marker update must not lose that checkpoint.
A save that fails (``writing``: a full disk, a worker's write error) deletes its ``.tmp`` directory and is an
error naming the free space and the checkpoint a rerun resumes from.
``verify`` checks a checkpoint's files before anything is loaded (the small files are read; each shard must
be as long as its ``.metadata`` says), so a damaged directory is an error naming the path and the fix, not a
traceback from deep inside a loader.
``prune`` keeps the newest ``trainer.max_ckpt_to_keep`` after each save (verl's ``max_actor_ckpt_to_keep`` /
``max_critic_ckpt_to_keep`` are that key: a checkpoint here holds actor and critic together, so it is kept or deleted
whole and resume never meets half of one).
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

from verl.errors import CheckpointError  # noqa: F401 -- raised here, defined below torch

logger = logging.getLogger(__name__)

LATEST = "latest_checkpointed_iteration.txt"
PREFIX = "global_step_"




def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step}"


def complete_steps(root: str | Path) -> list[int]:
    """Steps of the committed checkpoints under ``root`` (``global_step_N`` directories), ascending."""
    if not Path(root).is_dir():
        return []
    names = [p.name[len(PREFIX):] for p in Path(root).glob(PREFIX + "*") if p.is_dir()]
    return sorted(int(n) for n in names if n.isdigit())


def find_latest(root: str | Path, at_most: int | None = None) -> Path | None:
    """The newest committed checkpoint under ``root`` (of a step <= ``at_most`` if given), or None."""
    steps = [s for s in complete_steps(root) if at_most is None or s <= at_most]
    return step_dir(root, steps[-1]) if steps else None


def begin(root: str | Path, step: int) -> Path:
    """A fresh temporary directory to write step ``step``'s checkpoint into (left-over ``.tmp`` ones are deleted)."""
    for stale in Path(root).glob(PREFIX + "*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(root) / f"{PREFIX}{step}.tmp"
    tmp.mkdir(parents=True)
    return tmp


@contextmanager
def writing(root: str | Path, step: int) -> Iterator[Path]:
    """``begin``'s temporary directory for step ``step``'s checkpoint; if writing it fails (a full disk, a file-size
    limit, a worker's write error), the partial directory is deleted, so it holds no space, and ``CheckpointError``
    says what failed, the free space, the size of the last complete checkpoint and which one a rerun resumes from."""
    tmp = begin(root, step)
    try:
        yield tmp
    except (Exception, CheckpointException) as err:  # torch's CheckpointException is a BaseException
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failure(Path(root), step, err)) from err


def _write_failure(root: Path, step: int, err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    cause = f"{type(err).__name__}: {lines[-1] if lines else ''}"  # a worker's error ends with its own last line
    last = find_latest(root)
    if last is None:
        resume = "there is no complete checkpoint yet, so a rerun starts over"
    else:
        size = sum(f.stat().st_size for f in last.rglob("*") if f.is_file())
        resume = f"the last complete checkpoint, {last} ({_bytes(size)}), is intact and a rerun resumes from it"
    return (f"saving the checkpoint of step {step} under {root} failed ({cause}); the disk there has "
            f"{_bytes(shutil.disk_usage(root).free)} free. The partial directory was deleted; {resume}. Free space, or "
            "point trainer.default_local_dir at a larger disk, and run the same command again")


def _bytes(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def commit(root: str | Path, tmp: Path, step: int, trainer_state: dict, config_yaml: str) -> Path:
    """Write the trainer state, move ``tmp`` into place and mark it the latest checkpoint."""
    state = {**trainer_state, "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                                      "torch": torch.get_rng_state()}}
    torch.save(state, tmp / "trainer.pt")
    (tmp / "config.yaml").write_text(config_yaml)
    final = step_dir(root, step)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    marker = Path(root) / LATEST
    marker.with_suffix(".tmp").write_text(str(step))
    marker.with_suffix(".tmp").rename(marker)
    return final


def prune(root: str | Path, keep: int | None, written: int) -> list[int]:
    """Delete the committed checkpoints under ``root`` beyond ``keep`` (``trainer.max_ckpt_to_keep``; None: none), after
    a save has committed step ``written``: that one stays, with the newest ``keep - 1`` others -> the steps deleted.
    Each is renamed to ``.tmp`` before it is deleted, so a kill in the middle leaves a directory resume never reads
    and the next ``begin`` removes."""
    if keep is None:
        return []
    others = [s for s in complete_steps(root) if s != written]
    doomed = others[:max(0, len(others) - (keep - 1))]
    for step in doomed:
        gone = Path(root) / f"{PREFIX}{step}.tmp"
        if gone.exists():  # a deletion killed before
            shutil.rmtree(gone)
        step_dir(root, step).rename(gone)
        shutil.rmtree(gone)
    if doomed:
        logger.info("deleted the checkpoint(s) of step %s (trainer.max_ckpt_to_keep=%d)", ", ".join(map(str, doomed)),
                    keep)
    return doomed


def verify(path: str | Path, parts: list[str]) -> None:
    """Check that ``path`` holds a complete checkpoint with the worker ``parts`` (``actor``, ``critic``) before
    anything is loaded; ``CheckpointError`` naming the path, what is wrong and the fix otherwise."""
    path = Path(path)
    fix = (f"delete {path} to resume from the checkpoint before it, or set trainer.resume_mode=disable (start "
           "over) or trainer.resume_mode=<another global_step_N directory>")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is not a directory; {fix}")
    needed = ["trainer.pt", "config.yaml"] + [f"{part}/{name}" for part in parts
                                              for name in (".metadata", "extra_state.pt")]
    missing = [name for name in needed if not (path / name).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete or corrupt: missing {', '.join(missing)}; {fix}")
    reading = "trainer.pt"
    try:
        state = torch.load(path / reading, weights_only=False)
        if not isinstance(state, dict) or not {"step", "loader", "rng"} <= state.keys():
            raise ValueError("no step / loader / rng entries")
        shard_sizes = {}
        for part in parts:
            reading = f"{part}/extra_state.pt"
            torch.load(path / reading, weights_only=True)
            reading = f"{part}/.metadata"
            shard_sizes.update(_shard_sizes(path / part))
    except Exception as err:  # any unpickling failure means the same thing here
        raise CheckpointError(f"checkpoint {path} is corrupt: {reading} does not load ({type(err).__name__}: {err}); "
                              f"{fix}") from err
    for shard, end in sorted(shard_sizes.items()):
        size = shard.stat().st_size if shard.is_file() else None
        if size is None or size < end:
            problem = "is missing" if size is None else f"is truncated ({size:,} bytes; its .metadata needs {end:,})"
            raise CheckpointError(f"checkpoint {path} is incomplete or corrupt: {shard.relative_to(path)} {problem}; "
                                  f"{fix}")


def _shard_sizes(part_dir: Path) -> dict[Path, int]:
    """The shard files a worker's ``.metadata`` (``torch.distributed.checkpoint``) points into and the size each must
    have at least (the end of the last tensor it holds), so a truncated or missing shard is found before loading."""
    metadata = FileSystemReader(str(part_dir)).read_metadata()
    sizes: dict[Path, int] = {}
    for item in metadata.storage_data.values():  # one _StorageInfo (file, offset, length) per stored item
        shard = part_dir / item.relative_path
        sizes[shard] = max(sizes.get(shard, 0), item.offset + item.length)
    return sizes


def load_trainer_state(path: str | Path) -> dict:
    """Read ``trainer.pt`` of a checkpoint and restore the RNG states it saved."""
    state = torch.load(Path(path) / "trainer.pt", weights_only=False)
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return state
