#!/usr/bin/env bash
# GRPO: groups of n=5 samples per prompt, no critic, KL as a loss term (configs/grpo.yaml, layered over
# configs/ppo_trainer.yaml; every key=value argument overrides both). Demo and real-data use as in train_ppo.sh.
cd "$(dirname "$0")"
source scripts/launch_common.sh
run_trainer demo_grpo configs/grpo.yaml "$@"
