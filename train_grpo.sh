#!/usr/bin/env bash
# GRPO: groups of n=5 samples per prompt, no critic, KL as a loss term. No arguments: the embedded demo.
# Every key=value argument overrides configs/ppo_trainer.yaml (see train_ppo.sh for a real-data example).
cd "$(dirname "$0")"
source scripts/launch_common.sh
run_trainer algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=5 actor_rollout_ref.actor.use_kl_loss=true \
  trainer.experiment_name=demo_grpo "$@"
