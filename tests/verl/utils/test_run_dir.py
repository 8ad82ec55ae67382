"""verl.utils.run_dir: a run made before a config key existed continues when the new config holds that key's
default, and is refused when it sets another value."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl.config import Config, steering_keys, to_yaml
from verl.utils.run_dir import RunDirError, claim, config_differences


def _without(yaml_text: str, dotted: str) -> str:
    """The config with the section ``dotted`` removed, as a version that predates it wrote it."""
    node = OmegaConf.to_container(OmegaConf.create(yaml_text))
    *parents, last = dotted.split(".")
    parent = node
    for key in parents:
        parent = parent[key]
    del parent[last]
    return OmegaConf.to_yaml(OmegaConf.create(node))


def _old_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    (out / "global_step_2").mkdir(parents=True)
    (out / "config.yaml").write_text(_without(to_yaml(Config()), "actor_rollout_ref.rollout.multi_turn"))
    return out


def test_new_keys_at_their_defaults_continue_an_older_run(tmp_path: Path) -> None:
    cfg = Config()
    out = _old_run(tmp_path)
    defaults = to_yaml(Config())
    assert config_differences((out / "config.yaml").read_text(), to_yaml(cfg), steering_keys(cfg), defaults) == []
    # without the defaults every new key is a difference (what stranded runs made before the key existed)
    assert any(d.startswith("actor_rollout_ref.rollout.multi_turn.format: '(absent)'")
               for d in config_differences((out / "config.yaml").read_text(), to_yaml(cfg), steering_keys(cfg)))
    claim(out, to_yaml(cfg), str(out / "global_step_2"), False, steering_keys(cfg), defaults)


def test_a_new_key_set_away_from_its_default_is_refused(tmp_path: Path) -> None:
    cfg = Config()
    cfg.actor_rollout_ref.rollout.multi_turn.format = "hermes"
    out = _old_run(tmp_path)
    with pytest.raises(RunDirError, match=r"different config \(actor_rollout_ref\.rollout\.multi_turn\.format: "
                                          r"'\(absent\)' -> 'hermes'\)"):
        claim(out, to_yaml(cfg), str(out / "global_step_2"), False, steering_keys(cfg), to_yaml(Config()))


def test_a_key_the_new_config_lacks_is_still_a_difference() -> None:
    old = to_yaml(Config())
    new = _without(old, "actor_rollout_ref.rollout.multi_turn")
    assert "actor_rollout_ref.rollout.multi_turn.max_parallel_calls: 4 -> '(absent)'" in \
        config_differences(old, new, frozenset(), old)
