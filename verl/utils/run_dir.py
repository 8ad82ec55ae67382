"""One directory per run: a run directory that holds another run is refused, never appended to.

``trainer.default_local_dir`` receives ``config.yaml`` (the full resolved config, written when a run starts),
``metrics.jsonl``, ``curves.png``, ``global_step_N/`` checkpoints and ``hf_model/``. A run may start in it when

* it is empty or new, or holds only a run that failed before its first step; or
* it holds a run of the same config (keys that only steer the run, declared ``steers`` in the config's schema
  (``verl.config.steering_keys``): the step budget, loggers, validation and checkpoint frequency, a
  service's address, the directory's own path (so a run directory can be moved or copied and continued), ...,
  may differ) and ``trainer.resume_mode=auto``
  finds a checkpoint there to continue from (the crash-and-rerun case), or the command only validates.
  A key the saved config lacks (the run was made before the key existed) counts as the same when the new config
  holds its declared default: a key is added with the default that keeps the earlier behaviour, so an upgrade
  does not strand the runs made before it; a key saved under an earlier name that is now another spelling of it
  (``renamed``) is read under its name now.

Anything else (a different config; metrics of a run with no checkpoint to continue; ``resume_mode=disable``
over an earlier run) is a ``RunDirError`` naming the directory, the reason and the way out, because starting
over in place would mix two runs' metrics (steps 0,1,2,0,1,2) and overwrite the first run's ``hf_model/``.

Check, then write: ``claim`` and ``resume_checkpoint`` (which finds the checkpoint a run continues from and
verifies it, so a damaged one is refused before anything loads) only read; the trainer writes ``config.yaml`` with
``record_config`` once every start-up check has passed (the recipe's too: the search recipe's service check, which
writes ``retrieval.json`` last). A refused command (exit 2) leaves every file of the directory as it was.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path

from omegaconf import OmegaConf

from verl.errors import RunDirError  # noqa: F401 -- raised here, defined below torch
from verl.utils import checkpoint

CONFIG_FILE = "config.yaml"




def _flat(yaml_text: str) -> dict[str, object]:
    out: dict[str, object] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            out[prefix] = node
    walk(OmegaConf.to_container(OmegaConf.create(yaml_text), resolve=False), "")
    return out


def config_differences(old_yaml: str, new_yaml: str, steering: Collection[str],
                       defaults_yaml: str | None = None, renamed: Mapping[str, str] | None = None) -> list[str]:
    """``key: old -> new`` for every key (outside ``steering``: the keys that only steer a run) whose value differs
    between two resolved configs. With ``defaults_yaml`` (the config of all defaults), a key ``old_yaml`` lacks
    and ``new_yaml`` holds at its default is not a difference. ``renamed``: a key's earlier name -> its name now
    (``verl.config.renamed_keys``); ``old_yaml``'s keys are read under their names now."""
    old, new = _flat(old_yaml), _flat(new_yaml)
    old = {(renamed or {}).get(key, key): value for key, value in old.items()}
    defaults = _flat(defaults_yaml) if defaults_yaml is not None else {}
    absent = object()
    keys = sorted((set(old) | set(new)) - set(steering))
    return [f"{key}: {old.get(key, '(absent)')!r} -> {new.get(key, '(absent)')!r}" for key in keys
            if old.get(key, "(absent)") != new.get(key, "(absent)")
            and not (key not in old and key in new and defaults.get(key, absent) == new[key])]


def _holds_a_run(out: Path) -> bool:
    """A checkpoint, or metrics of a trained step. A run that failed before its first step (only config.yaml, or
    only the validation before training, logged at step 0) is started again in place."""
    if any(out.glob("global_step_*")):
        return True
    metrics = out / "metrics.jsonl"
    if not metrics.exists():
        return False
    for line in metrics.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) > 0:
                return True
        except json.JSONDecodeError:  # a line torn by a kill
            continue
    return False


def claim(out: Path, config_yaml: str, resume_mode: str, validate_only: bool, steering: Collection[str],
          defaults_yaml: str | None = None, renamed: Mapping[str, str] | None = None) -> None:
    """Check that a run with ``config_yaml`` may start in ``out`` (see the module docstring; ``steering``: the keys a
    rerun may change; ``defaults_yaml``: the config of all defaults, for keys the saved config predates;
    ``renamed``: earlier names of keys -> their names now, for a saved config that predates a rename). Writes
    nothing: ``record_config`` does, once the run has passed every start-up check."""
    way_out = ("choose another directory (trainer.experiment_name=NAME or trainer.default_local_dir=DIR) or move "
               f"{out} aside")
    if out.exists() and not out.is_dir():
        raise RunDirError(f"trainer.default_local_dir={str(out)!r} is a file, not a directory: {way_out}")
    if out.is_dir() and _holds_a_run(out) and not validate_only:
        saved = out / CONFIG_FILE
        if saved.exists():
            differences = config_differences(saved.read_text(), config_yaml, steering, defaults_yaml, renamed)
            if differences:
                shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6
                                                       else "")
                raise RunDirError(f"{out} holds a run with a different config ({shown}): {way_out}")
        if resume_mode == "disable":
            raise RunDirError(f"{out} holds an earlier run and trainer.resume_mode=disable would start over in it, "
                              f"mixing the two runs' metrics: {way_out}")
        if resume_mode == "auto" and checkpoint.find_latest(out) is None:
            raise RunDirError(f"{out} holds an earlier run but no checkpoint to continue from (it ran with "
                              f"trainer.save_freq=-1, or was stopped before its first save): {way_out}")


def resume_checkpoint(out: Path, resume_mode: str, parts: Collection[str]) -> Path | None:
    """The checkpoint a run in ``out`` continues from (``resume_mode``: auto = the newest, if any; disable = none;
    else a path), verified to hold the worker ``parts`` (``checkpoint.verify``: a damaged one is a CheckpointError
    before anything is loaded or written)."""
    path = None if resume_mode == "disable" else checkpoint.find_latest(out) if resume_mode == "auto" \
        else Path(resume_mode)
    if path is not None:
        checkpoint.verify(path, list(parts))
    return path


def record_config(out: Path, config_yaml: str) -> None:
    """Write the run's ``config.yaml`` into ``out`` (created), atomically: called once the run has passed every
    start-up check, so a refused command never rewrites it."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (CONFIG_FILE + ".tmp")
    tmp.write_text(config_yaml)
    tmp.replace(out / CONFIG_FILE)
