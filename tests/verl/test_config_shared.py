"""The SFT trainer's config holds the RL config's optimiser and run sections (``verl.config.shared``), and every key
users type keeps working: verl's SFT names are spellings of the shared keys, in either trainer.

Guards against issue 58's config items: ``SFTOptimConfig`` and ``OptimConfig`` declared the same knobs twice under
other names (two declarations that drift apart), the SFT config imported the RL loader's private ``_put`` /
``_yaml_pairs``, and a value refused under another spelling was named by our key, which the user never typed.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from torch import nn

from verl.config import (
    Config,
    ConfigError,
    OptimConfig,
    RunConfig,
    SFTConfig,
    TrainerConfig,
    declared,
    load_config,
    load_sft_config,
    renamed_keys,
    steering_keys,
    to_yaml,
)
from verl.utils.run_dir import RunDirError, claim
from verl.workers.train_utils import TrainState

ROOT = Path(__file__).resolve().parents[2]
SFT = ["model.partial_pretrain=/models/tiny", "data.train_files=/data/sft/train.parquet"]


def test_the_sft_config_declares_no_optimiser_or_run_key_of_its_own():
    """Each key of the SFT config's optim and trainer sections is the RL config's declaration itself (one object),
    except clip_grad, the gradient bound the RL config keeps on the actor and critic."""
    sft, rl = SFTConfig(), Config()
    assert isinstance(sft.optim, OptimConfig) and type(sft.trainer) is RunConfig
    assert isinstance(rl.trainer, RunConfig) and isinstance(rl.actor_rollout_ref.actor.optim, OptimConfig)
    for section, shared in ((type(sft.optim), OptimConfig), (type(sft.trainer), RunConfig), (TrainerConfig, RunConfig)):
        for f in dataclasses.fields(shared):
            assert declared(section, f.name) is declared(shared, f.name), (section, f.name)
    extra = {f.name for f in dataclasses.fields(sft.optim)} - {f.name for f in dataclasses.fields(OptimConfig)}
    assert extra == {"clip_grad"}
    # what differs between the trainers is a default given where the section is placed
    assert (sft.optim.lr, sft.optim.weight_decay, rl.actor_rollout_ref.actor.optim.lr) == (1e-5, 0.01, 1e-6)
    assert (sft.trainer.project_name, sft.trainer.test_freq, rl.trainer.test_freq) == ("verl_sft", -1, 10)


def test_verls_sft_names_and_ours_set_the_same_setting():
    verls = load_sft_config([*SFT, "optim.warmup_steps_ratio=0.25", "optim.lr_scheduler=cosine"])
    ours = load_sft_config([*SFT, "optim.lr_warmup_steps_ratio=0.25", "optim.warmup_style=cosine"])
    assert verls.optim == ours.optim and (ours.optim.lr_warmup_steps_ratio, ours.optim.warmup_style) == (0.25, "cosine")
    # the shared section brings the same spellings to the RL actor and critic
    rl = load_config(["actor_rollout_ref.actor.optim.lr_scheduler=cosine", "critic.optim.warmup_steps_ratio=0.5"])
    assert (rl.actor_rollout_ref.actor.optim.warmup_style, rl.critic.optim.lr_warmup_steps_ratio) == ("cosine", 0.5)
    with pytest.raises(ConfigError, match=r"optim.warmup_steps_ratio=0.25 and optim.lr_warmup_steps_ratio=0.5 set the "
                                          r"same setting \(optim.lr_warmup_steps_ratio\)"):
        load_sft_config([*SFT, "optim.warmup_steps_ratio=0.25", "optim.lr_warmup_steps_ratio=0.5"])


@pytest.mark.parametrize("load, override, named", [
    (load_sft_config, "optim.lr_scheduler=linear", "optim.lr_scheduler='linear' (optim.warmup_style here)"),
    (load_config, "actor_rollout_ref.actor.optim.lr_scheduler_type=linear",
     "actor_rollout_ref.actor.optim.lr_scheduler_type='linear' (actor_rollout_ref.actor.optim.warmup_style here)"),
    (load_config, "actor_rollout_ref.actor.lr=2.0", "actor_rollout_ref.actor.lr=2.0 (actor_rollout_ref.actor.optim.lr "
                                                    "here)"),
], ids=["sft-verl-name", "rl-verl-newer-name", "rl-search-r1-name"])
def test_a_value_refused_under_another_spelling_is_named_as_given(load, override, named):
    with pytest.raises(ConfigError) as refused:
        load([override])
    assert str(refused.value).startswith(f"config key {named} is invalid: allowed "), refused.value


def test_optimiser_keys_are_checked_alike_in_both_trainers():
    for load, key in ((load_sft_config, "optim.betas"), (load_config, "critic.optim.betas")):
        with pytest.raises(ConfigError, match=rf"{key}=\[0.9\] is invalid: allowed two numbers in \[0, 1\)"):
            load([f"{key}=[0.9]"])
        with pytest.raises(ConfigError, match=rf"{key}=1.5 is invalid: allowed a list of numbers in \[0, 1\)"):
            load([f"{key}=[0.9,1.5]"])
    for load in (load_sft_config, load_config):
        with pytest.raises(ConfigError, match="config key trainer.resume_mode='/no/such/checkpoint' is invalid"):
            load(["trainer.resume_mode=/no/such/checkpoint"])


def test_the_rl_optimiser_honours_betas_as_the_sft_one_does():
    """Guards against a key declared in the shared section that one trainer's optimiser ignores."""
    rl = load_config(["actor_rollout_ref.actor.optim.betas=[0.8,0.9]"]).actor_rollout_ref.actor.optim
    sft = load_sft_config([*SFT, "optim.betas=[0.8,0.9]"]).optim
    for optim in (rl, sft):
        state = TrainState.from_optim(nn.Linear(2, 2), optim, total_optimizer_steps=4, grad_clip=1.0)
        assert state.optimizer.param_groups[0]["betas"] == (0.8, 0.9)
    assert TrainState.from_optim(nn.Linear(2, 2), Config().critic.optim, 4, 1.0).optimizer.defaults["betas"] == \
        (0.9, 0.999)  # the default is what AdamW had before the key existed


def test_an_sft_run_saved_under_verls_names_continues(tmp_path):
    """A run directory written before the sections were shared holds verl's SFT names (optim.warmup_steps_ratio,
    optim.lr_scheduler) and the project name the SFT trainer had then: a rerun of the same command continues it;
    another value of the renamed key is refused."""
    cfg = load_sft_config([*SFT, f"trainer.default_local_dir={tmp_path / 'run'}"])
    saved = OmegaConf.to_container(OmegaConf.create(to_yaml(cfg)))
    saved["trainer"]["project_name"] = "search_r1_sft"
    optim = saved["optim"]
    optim["warmup_steps_ratio"], optim["lr_scheduler"] = optim.pop("lr_warmup_steps_ratio"), optim.pop("warmup_style")
    out = tmp_path / "run"
    (out / "global_step_2").mkdir(parents=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(saved)))
    args = (str(out / "global_step_2"), False, steering_keys(cfg), to_yaml(SFTConfig()))
    claim(out, to_yaml(cfg), *args, renamed_keys(SFTConfig))
    with pytest.raises(RunDirError, match=r"optim.lr_scheduler: 'constant' -> '\(absent\)'"):
        claim(out, to_yaml(cfg), *args)  # without the renames the saved keys read as keys the config lacks
    cfg.optim.warmup_style = "cosine"
    with pytest.raises(RunDirError, match=r"optim.warmup_style: 'constant' -> 'cosine'"):
        claim(out, to_yaml(cfg), *args, renamed_keys(SFTConfig))


def test_no_module_imports_a_private_name_of_the_config_package():
    """``from verl.config.load import _put`` ties one module to another's internals; the package's modules share
    public functions only."""
    private = []
    for path in sorted((ROOT / "verl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("verl.config"):
                private += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_")]
    assert private == []
