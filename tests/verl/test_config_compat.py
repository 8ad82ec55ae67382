"""Search-R1's launch scripts and verl's key names load and mean here what they mean there.

Guards against a Search-R1 user's `train_grpo.sh` stopping at the first key we spell differently
(`actor_rollout_ref.actor.optim.lr`, `rollout.n_agent`, `+trainer.val_only=...`), against a foreign key being
accepted while silently asking for something this trainer does not do (`actor.strategy=megatron`), and against
global micro-batch sizes being used per rank (8x the memory on 8 GPUs). The override lists below are written from
Search-R1's published train_ppo.sh / train_grpo.sh (BASE_MODEL, DATA_DIR and EXPERIMENT_NAME filled in).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import save_tiny_model
from retrieval_server.launcher import ServerProcess
from search_r1.config import SearchConfig
from search_r1.prompts import make_prompt
from tests.entry_points import main_ppo_in_process
from tests.search_workspace import build_search_workspace
from verl.config import Config, ConfigError, load_config, load_sft_config, setting
from verl.config.compat import Alias, GlobalCount, NoEffect, rules

ROOT = Path(__file__).resolve().parents[2]


def search_r1_ppo(base_model: str, data_dir: str, experiment: str) -> list[str]:
    return [
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        "data.train_data_num=null", "data.val_data_num=null", "data.train_batch_size=512", "data.val_batch_size=256",
        "data.max_prompt_length=4096", "data.max_response_length=500", "data.max_start_length=2048",
        "data.max_obs_length=500", "data.shuffle_train_dataloader=True", "algorithm.adv_estimator=gae",
        f"actor_rollout_ref.model.path={base_model}", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size=64", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.grad_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=128",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=128", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "actor_rollout_ref.rollout.n_agent=1", "actor_rollout_ref.rollout.temperature=1",
        "actor_rollout_ref.actor.state_masking=true", "critic.optim.lr=1e-5", "critic.model.use_remove_padding=True",
        "critic.optim.lr_warmup_steps_ratio=0.015", f"critic.model.path={base_model}",
        "critic.model.enable_gradient_checkpointing=true", "critic.ppo_micro_batch_size=8",
        "critic.model.fsdp_config.param_offload=true", "critic.model.fsdp_config.grad_offload=true",
        "critic.model.fsdp_config.optimizer_offload=true", "algorithm.kl_ctrl.kl_coef=0.001",
        "algorithm.no_think_rl=false", "trainer.critic_warmup=0", "trainer.logger=['wandb']",
        "+trainer.val_only=false", "+trainer.val_before_train=true", "trainer.default_hdfs_dir=null",
        "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=100", "trainer.test_freq=50",
        "trainer.project_name=Search-R1", f"trainer.experiment_name={experiment}", "trainer.total_epochs=15",
        "trainer.total_training_steps=1005", "trainer.default_hdfs_dir=null",
        f"trainer.default_local_dir=verl_checkpoints/{experiment}", "max_turns=2",
        "retriever.url=http://127.0.0.1:8000/retrieve", "retriever.topk=3",
    ]


def search_r1_grpo(base_model: str, data_dir: str, experiment: str) -> list[str]:
    return [
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        "data.train_data_num=null", "data.val_data_num=null", "data.train_batch_size=512", "data.val_batch_size=256",
        "data.max_prompt_length=4096", "data.max_response_length=500", "data.max_start_length=2048",
        "data.max_obs_length=500", "data.shuffle_train_dataloader=True", "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={base_model}", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_micro_batch_size=64",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.grad_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=128",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=128", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "algorithm.no_think_rl=false", "actor_rollout_ref.rollout.n_agent=5", "actor_rollout_ref.rollout.temperature=1",
        "actor_rollout_ref.actor.state_masking=true", "trainer.logger=['wandb']", "+trainer.val_only=false",
        "+trainer.val_before_train=true", "trainer.default_hdfs_dir=null", "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1", "trainer.save_freq=100", "trainer.test_freq=50", "trainer.project_name=Search-R1",
        f"trainer.experiment_name={experiment}", "trainer.total_epochs=15", "trainer.total_training_steps=1005",
        "trainer.default_hdfs_dir=null", f"trainer.default_local_dir=verl_checkpoints/{experiment}", "max_turns=2",
        "retriever.url=http://127.0.0.1:8000/retrieve", "retriever.topk=3",
    ]


ON_RAY_8 = ["trainer.backend=ray"]  # Search-R1's 8 GPUs: our Ray backend (validation only, nothing starts)


def test_search_r1_ppo_script_loads_with_its_meaning(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        cfg = load_config(search_r1_ppo("Qwen/Qwen2.5-3B", "data/nq_search", "ppo-qwen") + ON_RAY_8)
    a, c = cfg.actor_rollout_ref.actor, cfg.critic
    assert (a.optim.lr, a.optim.lr_warmup_steps_ratio, c.optim.lr, c.optim.lr_warmup_steps_ratio) == \
        (1e-6, 0.285, 1e-5, 0.015)
    assert a.fsdp_config.offload and c.model.fsdp_config.offload and cfg.actor_rollout_ref.ref.fsdp_config.param_offload
    assert c.model.path == "Qwen/Qwen2.5-3B" and c.model.enable_gradient_checkpointing
    # Global micro-batch sizes over 8 ranks, as Search-R1's workers divide them.
    assert a.ppo_micro_batch_size_per_gpu == 8 and c.ppo_micro_batch_size_per_gpu == 1
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 16
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 16
    assert cfg.actor_rollout_ref.rollout.n == 1 and a.ppo_mini_batch_size == 256
    assert cfg.retriever.url == "http://127.0.0.1:8000"  # Search-R1 names the endpoint; ours is the base URL
    assert (cfg.data.train_max_samples, cfg.data.shuffle, cfg.trainer.val_before_train, cfg.trainer.logger) == \
        (None, True, True, ["wandb"])
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps, cfg.max_turns) == (15, 1005, 2)
    assert cfg.trainer.default_local_dir == "verl_checkpoints/ppo-qwen"
    notices = caplog.text
    for key in ("trainer.default_hdfs_dir", "use_remove_padding", "ppo_micro_batch_size=64"):
        assert key in notices
    assert notices.count("trainer.default_hdfs_dir") == 1  # given twice in the script, said once


def test_search_r1_grpo_script_loads_with_its_meaning():
    cfg = load_config(search_r1_grpo("Qwen/Qwen2.5-3B", "data/nq_search", "grpo-qwen") + ON_RAY_8)
    a = cfg.actor_rollout_ref.actor
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 5  # n_agent
    assert a.use_kl_loss and (a.kl_loss_coef, a.kl_loss_type) == (0.001, "low_var_kl")
    # ppo_mini_batch_size counts trajectories, as in Search-R1: 512 prompts x 5 = 2560 per step, 10 updates.
    assert cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n // a.ppo_mini_batch_size == 10


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.strategy=megatron", r"strategy='megatron'.*FSDP2.*allowed: 'fsdp', 'fsdp2'"),
    ("algorithm.no_think_rl=true", r"no_think_rl=True.*allowed: False"),
    ("actor_rollout_ref.rollout.mode=spmd", r"rollout.mode.*spmd.*sync, async"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", r"sequence parallelism"),
    ("~trainer.val_only", r"deleting keys"),
    ("trainer.no_such_key=1", r"unknown config key 'trainer.no_such_key'"),
])
def test_a_foreign_key_asking_for_what_we_do_not_do_is_an_error_naming_it(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config([override] if "=" in override else [override + "=1"])


def test_two_spellings_of_one_setting_with_different_values_are_an_error():
    with pytest.raises(ConfigError, match=r"rollout.n=3.*rollout.n_agent=5.*same setting"):
        load_config(["actor_rollout_ref.rollout.n=3", "actor_rollout_ref.rollout.n_agent=5"])
    cfg = load_config(["actor_rollout_ref.rollout.n=5", "actor_rollout_ref.rollout.n_agent=5"])  # agreeing is fine
    assert cfg.actor_rollout_ref.rollout.n == 5


def test_verls_checkpoint_counts_are_one_key_here():
    """verl keeps actor and critic checkpoints apart (max_actor_ckpt_to_keep, max_critic_ckpt_to_keep; its SFT trainer
    max_ckpt_to_keep); here a checkpoint is one directory holding both, so the three are one key: its launch lines
    (both at 1) load, and two different counts, which cannot both be honoured, are refused naming both."""
    cfg = load_config(["trainer.max_actor_ckpt_to_keep=1", "trainer.max_critic_ckpt_to_keep=1"])
    assert cfg.trainer.max_ckpt_to_keep == 1
    assert load_config([]).trainer.max_ckpt_to_keep is None  # verl's default: keep every checkpoint
    assert load_sft_config(["trainer.max_ckpt_to_keep=2"]).trainer.max_ckpt_to_keep == 2
    with pytest.raises(ConfigError, match=r"max_actor_ckpt_to_keep=2.*max_critic_ckpt_to_keep=3.*same setting"):
        load_config(["trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=3"])
    with pytest.raises(ConfigError, match=r"trainer\.max_ckpt_to_keep=0 .*>= 1"):
        load_config(["trainer.max_ckpt_to_keep=0"])


def test_verls_overlong_buffer_keys_are_the_soft_overlong_penalty(caplog):
    """verl's DAPO recipe spells the soft overlong punishment reward_model.overlong_buffer.*: it means
    algorithm.overlong.mode=soft_penalty with its buffer and factor here, not a no-op under reward_model."""
    dapo = ["data.max_response_length=20480", "reward_model.reward_manager=dapo",
            "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=4096",
            "reward_model.overlong_buffer.penalty_factor=0.5", "reward_model.overlong_buffer.log=True"]
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        overlong = load_config(dapo).algorithm.overlong
    assert (overlong.mode, overlong.buffer_len, overlong.penalty_factor) == ("soft_penalty", 4096, 0.5)
    assert "reward_model.overlong_buffer.log has no effect here: train/overlong_frac" in caplog.text
    assert load_config(["reward_model.overlong_buffer.enable=false"]).algorithm.overlong.mode == "none"
    with pytest.raises(ConfigError, match=r"reward_model\.overlong_buffer\.enable='soft' is invalid: allowed True, "
                                          r"False \(True = algorithm\.overlong\.mode=soft_penalty, False = "
                                          r"algorithm\.overlong\.mode=none\)"):
        load_config(["reward_model.overlong_buffer.enable=soft"])
    with pytest.raises(ConfigError, match=r"overlong_buffer\.enable=True and algorithm\.overlong\.mode='mask' set the "
                                          r"same setting"):
        load_config(["reward_model.overlong_buffer.enable=true", "algorithm.overlong.mode=mask"])


def test_a_launcher_layer_is_overridden_by_the_users_spelling_without_conflict(tmp_path):
    """train_grpo.sh's configs/grpo.yaml says rollout.n=5; Search-R1's n_agent=3 on the command line wins."""
    cfg = load_config(["actor_rollout_ref.rollout.n_agent=3"], [ROOT / "configs" / "grpo.yaml"])
    assert cfg.actor_rollout_ref.rollout.n == 3 and cfg.algorithm.adv_estimator == "grpo"


def test_train_data_num_trains_on_a_seeded_subset(tmp_path):
    """data.train_data_num (Search-R1) = data.train_max_samples: a random subset, the same for the same seed."""
    from verl.utils.dataset import PromptDataset

    questions = [f"question number {i}" for i in range(20)]
    save_tiny_model(tmp_path / "model", [make_prompt(q) for q in questions], vocab_size=300)
    rows_to_parquet([make_row("toy", q, ["a"], "train", i) for i, q in enumerate(questions)], tmp_path / "t.parquet")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    cfg = load_config(["data.train_data_num=5"])
    assert cfg.data.train_max_samples == 5
    picks = [[r["extra_info"]["index"] for r in PromptDataset(str(tmp_path / "t.parquet"), tok, 256, "prompt", 5,
                                                               sample_seed=seed).rows] for seed in (1, 1, 2)]
    assert len(picks[0]) == 5 and picks[0] == picks[1] != picks[2] and picks[0] != list(range(5))


@dataclass
class _TwiceSpelled(Config):
    first: int = setting(1, "A setting.", spellings=(Alias("old.name"),))
    second: int = setting(2, "Another.", spellings=(Alias("old.name"),))


def test_spellings_are_declared_on_their_settings_and_make_one_table():
    """Guards against a spelling table that drifts from the settings it names (a renamed key whose alias still
    points at the old name) and against one spelling silently meaning two settings."""
    table = rules(SearchConfig)
    assert table["data.train_data_num"].to == "data.train_max_samples"
    assert table["actor_rollout_ref.actor.lr"].to == "actor_rollout_ref.actor.optim.lr"
    assert table["critic.lr"].to == "critic.optim.lr"  # one relative spelling (../lr) on the shared OptimConfig
    assert table["critic.ppo_micro_batch_size"] == GlobalCount("critic.ppo_micro_batch_size",
                                                                to="critic.ppo_micro_batch_size_per_gpu")
    assert isinstance(table["trainer.default_hdfs_dir"], NoEffect)
    with pytest.raises(ValueError, match=r"the spelling old.name \(declared on second\) is declared twice"):
        rules(_TwiceSpelled)


@pytest.fixture(scope="module")
def search_workspace(tmp_path_factory) -> Path:
    return build_search_workspace(tmp_path_factory.mktemp("search_r1_scripts"), data_source="nq")


@pytest.mark.slow
def test_one_grpo_step_with_search_r1s_grpo_script(search_workspace, tmp_path):
    """The published GRPO overrides, then the sizes scaled to a 2-core machine (the same key names, so the later
    value wins): one step trains against a real retrieval service at Search-R1's /retrieve URL, with the
    actor and reference offloaded and gradient checkpointing on, and exits 0."""
    ws = search_workspace
    with ServerProcess(ws / "index", ws / "corpus.jsonl") as server:
        server.wait_ready()
        scaled = ["data.train_batch_size=4", "data.val_batch_size=4", "data.max_response_length=48",
                  "data.max_obs_length=128", "actor_rollout_ref.actor.ppo_mini_batch_size=10",
                  "actor_rollout_ref.actor.ppo_micro_batch_size=5",
                  "actor_rollout_ref.rollout.log_prob_micro_batch_size=10",
                  "actor_rollout_ref.ref.log_prob_micro_batch_size=10", "actor_rollout_ref.rollout.name=hf",
                  "trainer.n_gpus_per_node=1", "trainer.logger=['jsonl']", "trainer.total_training_steps=1",
                  f"retriever.url={server.url}/retrieve", f"trainer.default_local_dir={tmp_path / 'run'}",
                  "trainer.device=cpu"]
        args = search_r1_grpo(str(ws / "model"), str(ws / "data"), "grpo-tiny") + scaled
        done = main_ppo_in_process(*args)  # the trainer's main in this process (tests/entry_points.py)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in records if r["step"] == 1 and "actor/pg_loss" in r]
    assert len(step) == 1 and "actor/kl_loss" in step[0]  # the KL loss of use_kl_loss=true ran
    assert "batch    4 prompts x 5 samples = 20 trajectories; 2 actor update(s)" in done.stdout
    assert "trainer.default_hdfs_dir has no effect here" in done.stderr
