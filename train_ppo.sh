#!/usr/bin/env bash
# PPO with a critic (GAE). No arguments: the embedded demo (tiny policy, demo knowledge base, CPU).
# Every key=value argument overrides configs/ppo_trainer.yaml, e.g. for Qwen2.5-3B on NQ+HotpotQA:
#   bash train_ppo.sh data.train_files=data/nq_hotpotqa/train.parquet data.val_files=data/nq_hotpotqa/test.parquet \
#     actor_rollout_ref.model.path=Qwen/Qwen2.5-3B actor_rollout_ref.rollout.dtype=bfloat16 trainer.n_gpus_per_node=8 ...
cd "$(dirname "$0")"
source scripts/launch_common.sh
run_trainer algorithm.adv_estimator=gae trainer.experiment_name=demo_ppo "$@"
