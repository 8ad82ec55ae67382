#!/usr/bin/env bash
# PPO with a critic (GAE). With no arguments naming data, a model or a service: the embedded demo (tiny policy,
# demo knowledge base, CPU), prepared here. Otherwise every key=value argument overrides configs/ppo_trainer.yaml
# (verl's and Search-R1's key names both work) and nothing is prepared for you, e.g. for Qwen2.5-3B on NQ+HotpotQA
# with a retrieval service already running on port 8000:
#   bash train_ppo.sh data.train_files=data/nq_hotpotqa/train.parquet data.val_files=data/nq_hotpotqa/test.parquet \
#     actor_rollout_ref.model.path=/models/Qwen2.5-3B actor_rollout_ref.rollout.name=vllm trainer.n_gpus_per_node=8 ...
# Options: --config FILE (a YAML layered over the defaults), --wait-for-retriever SECONDS (a service still loading).
cd "$(dirname "$0")"
source scripts/launch_common.sh
run_trainer demo_ppo "" "$@"
