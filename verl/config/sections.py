"""The trainer's sections of the config, each setting declared once (``verl.config.schema.setting``).

Every field here carries its default, its doc (the comment above its key in the generated
``configs/ppo_trainer.yaml`` and its row in docs/config.md), the values it allows and the other spellings it is
accepted under (``verl.config.compat``). The ``algorithm`` section is declared in ``verl.config.algorithm``, with
the registry lookups that the algorithm-valued settings here (policy loss, loss aggregation, KL estimator) take
their allowed names from; the sections the SFT trainer holds too (the optimiser, the run's keys of ``trainer``) in
``verl.config.shared``. The top-level ``Config`` (``verl.config.rl``) holds these sections; a recipe adds its own in
a subclass.

Sections used in two places (``OptimConfig``, ``FSDPConfig``) are documented once for both; the critic's learning
rate differs only in its default (``section(OptimConfig, lr=1e-5)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.config.algorithm import agg_mode_names, kl_estimator_names, policy_loss_names
from verl.config.compat import RENAMED, Alias, GlobalCount
from verl.config.schema import section, setting
from verl.config.shared import DTYPE_NAMES, OptimConfig, RunConfig
from verl.tools import format_names

_N_AGENT_NOTE = ("rollout.n_agent (Search-R1) is rollout.n here: samples per prompt; ppo_mini_batch_size counts "
                 "trajectories, as in Search-R1")


@dataclass
class DataConfig:
    train_files: str | None = setting(
        None, "Parquet file(s) of training rows in the Search-R1 schema (comma-separated for several). Required.")
    val_files: str | None = setting(
        None, "Parquet file(s) of validation rows (comma-separated for several). Required.", steers=True)
    prompt_key: str = setting("prompt", "Column of a row holding the chat messages of the prompt.")
    max_prompt_length: int = setting(
        4096, "Lengths, in tokens, with Search-R1's meanings (docs/design.md, \"Lengths\"); a sequence never holds "
        "more than min(max_prompt_length + max_response_length, max_start_length + max_trajectory_length) tokens, "
        "which must fit the model's max_position_embeddings (checked at start-up). The context a turn conditions on "
        "(prompt + response so far). Longer prompts are dropped (count logged); an insertion that would take the "
        "context past it ends the trajectory (agent/cut/max_prompt_length); Search-R1 left-cuts the context "
        "instead.", low=1)
    max_response_length: int = setting(
        500, "Tokens ONE turn may sample (Search-R1's per-turn response length). A turn cut here before an action "
        "gets the invalid-action feedback and the trajectory goes on, as in Search-R1 "
        "(agent/cut/max_response_length).", low=1)
    max_start_length: int = setting(
        2048, "The prompt that starts a trajectory, cut to its last max_start_length tokens (agent/truncated_prompts).",
        low=1)
    max_obs_length: int = setting(
        500, "Maximum tokens of one block the environment inserts (for example a search's passages); "
        "longer ones are truncated, counted in agent/truncated_obs, and a warning names this key when most are cut.",
        low=1)
    max_trajectory_length: int = setting(
        4096, "The whole response of a trajectory: every turn's sampled + inserted tokens (what the actor trains on "
        "after the prompt; algorithm.overlong's budget). Search-R1 cuts its response at max_prompt_length, hence "
        "4096; a trajectory that reaches it ends (agent/cut/max_trajectory_length, stop reason max_length).", low=1)
    train_batch_size: int = setting(
        32, "Prompts per training step (each sampled actor_rollout_ref.rollout.n times: trajectories = this x n).",
        low=1)
    val_batch_size: int | None = setting(
        None, "Prompts per validation batch; null = the whole validation set in one batch.", low=1, steers=True)
    shuffle: bool = setting(True, "Shuffle training rows each epoch (seeded by data.seed).",
                            spellings=(Alias("data.shuffle_train_dataloader"),))
    seed: int = setting(1, "Seed of the dataloader's shuffling (and of the train_max_samples subset).")
    train_max_samples: int | None = setting(
        None, "Train on a random subset of this many rows, drawn once with data.seed (null = all rows).", low=1,
        null_means="all rows", spellings=(Alias("data.train_data_num"),))
    val_max_samples: int | None = setting(
        None, "Keep at most this many validation rows (null = all), taken from the start of the file.", low=1,
        null_means="all rows", steers=True, spellings=(Alias("data.val_data_num"),))


@dataclass
class ModelConfig:
    path: str | None = setting(
        None, "Hugging Face model directory (config, weights, tokenizer with a chat template). Required.")
    enable_gradient_checkpointing: bool | None = setting(
        None, "Recompute activations in the backward pass to save memory (slower); null = on for models above 1B "
        "parameters.")
    trust_remote_code: bool = setting(False, "Let transformers run custom modelling code from the model directory.")
    lora_rank: int = setting(
        0, "LoRA rank of the actor (peft); 0 = train all weights. With LoRA only the adapters are trained and "
        "checkpointed, the reference policy is the actor with its adapters disabled (no second model), the rollout "
        "engines receive merged weights, and hf_model/ is exported merged.", low=0)
    lora_alpha: float = setting(16.0, "LoRA scaling numerator: adapters are scaled by lora_alpha / lora_rank.", low=0,
                                low_open=True, what="LoRA's scale numerator")
    target_modules: list[str] = setting(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                        "Modules (by name) that get adapters.")


@dataclass
class FSDPConfig:
    param_offload: bool = setting(
        False, "Keep the model's parameters, gradients and optimiser state in host memory between uses (FSDP2 "
        "CPUOffloadPolicy; the optimiser steps on the CPU). FSDP2 moves the three together: any of the three keys "
        "set to true offloads all of them. Saves device memory at the cost of transfers.")
    grad_offload: bool = setting(False, "Offload gradients (with FSDP2: the same as param_offload, see above).")
    optimizer_offload: bool = setting(
        False, "Offload the optimiser state (with FSDP2: the same as param_offload, see above).")
    dtype: str = setting(
        "float32", "Training precision (verl's name): the forward and backward run under autocast in this dtype, "
        "float32 | bfloat16 | float16; the trained weights, gradients and optimiser stay float32 either way. Separate "
        "from rollout.dtype (the engine's). float16 has no loss scaling here: prefer bfloat16.", choices=DTYPE_NAMES)

    @property
    def offload(self) -> bool:
        """FSDP2's CPUOffloadPolicy moves parameters, gradients and optimiser state together: any one asks for all."""
        return self.param_offload or self.grad_offload or self.optimizer_offload


@dataclass
class PolicyLossConfig:
    loss_mode: str = setting(
        "vanilla", "The policy loss, by its registered name (verl/algorithms/registry.py): {choices}. The built-ins "
        "(verl/algorithms/policy_losses.py): vanilla = PPO's clipped surrogate on each token's ratio | gspo = GSPO "
        "(Zheng et al. 2025): the same surrogate on the sequence ratio exp(mean over the row's policy tokens of log "
        "pi - log pi_old), so a row is clipped as a whole. Both use the clip_ratio* keys below (clip-higher, dual "
        "clip) and tis_cap. gspo wants a sequence-sized clip range and its own aggregation: clip_ratio_low=3e-4 "
        "clip_ratio_high=4e-4 loss_agg_mode=seq-mean-token-mean (the paper's; token-mean would weigh rows by their "
        "length).", choices=policy_loss_names)


@dataclass
class ActorConfig:
    optim: OptimConfig = section(OptimConfig)
    ppo_mini_batch_size: int = setting(
        32, "Trajectories per optimiser step, over all ranks (a trajectory = one prompt's sample; a step has "
        "data.train_batch_size x rollout.n of them, so updates per step = that / this x ppo_epochs). Search-R1 counts "
        "the same way (its GRPO repeats prompts with rollout.n_agent); today's verl counts prompts instead.", low=1)
    ppo_micro_batch_size_per_gpu: int = setting(
        8, "Trajectories per forward/backward pass on each rank; gradients are accumulated up to a mini-batch. "
        "(Search-R1's global ppo_micro_batch_size is accepted and divided by the number of ranks.)", low=1,
        spellings=(GlobalCount("actor_rollout_ref.actor.ppo_micro_batch_size"),))
    ppo_epochs: int = setting(1, "Passes over the step's batch (PPO epochs).", low=1)
    grad_clip: float | None = setting(
        1.0, "Maximum gradient norm (global L2) before the optimiser step; null = no clipping.", low=0, low_open=True,
        null_means="no clipping", what="a gradient-norm bound")
    policy_loss: PolicyLossConfig = section(PolicyLossConfig)
    clip_ratio: float = setting(
        0.2, "PPO ratio clip epsilon (used for the low side, and the high side unless clip_ratio_high is set).",
        low=0, high=1, low_open=True, what="PPO's clip range epsilon (ratio kept in 1 +- eps)")
    clip_ratio_low: float | None = setting(
        None, "Lower clip epsilon, in (0, 1): ratio is clipped at 1 - clip_ratio_low. null = clip_ratio. (gspo: "
        "3e-4.)", low=0, high=1, low_open=True, high_open=True, null_means="= clip_ratio")
    clip_ratio_high: float | None = setting(
        None, "Upper clip epsilon (DAPO clip-higher), > 0: ratio is clipped at 1 + clip_ratio_high. null = "
        "clip_ratio. (gspo: 4e-4.)", low=0, high=10, low_open=True, null_means="= clip_ratio",
        what="the upper clip range (DAPO's clip-higher)")
    clip_ratio_c: float | None = setting(
        3.0, "Dual-clip constant c (> 1) bounding the loss for negative advantages; null = off (the GSPO paper's "
        "loss).", low=1, high=1000, low_open=True, null_means="off",
        what="dual-clip PPO's bound on negative advantages")
    loss_agg_mode: str = setting(
        "token-mean", "How token losses are averaged ({choices}): DAPO's token-mean, Dr. GRPO's seq-mean-token-sum, "
        "GRPO's seq-mean-token-mean (GSPO's sequence objective with loss_mode=gspo).",
        choices=agg_mode_names)
    entropy_coeff: float = setting(0.0, "Weight of the entropy bonus in the actor loss (0 = off).", low=0)
    use_kl_loss: bool = setting(
        False, "Add a KL(actor || reference) term to the actor loss (GRPO style) instead of to the reward.")
    kl_loss_coef: float = setting(0.001, "Weight of the KL loss term.", low=0)
    kl_loss_type: str = setting("low_var_kl", "Estimator of the KL loss term: {choices}.", choices=kl_estimator_names)
    state_masking: bool = setting(
        True, "Mask tokens inserted by the environment (retrieved documents, feedback) out of every loss, KL, "
        "entropy, advantage and value term (loss_mask = response_mask * info_mask).")
    use_dynamic_bsz: bool = setting(
        False, "Pack micro-batches by token count instead of by row count (rows grouped by length, longest first).")
    ppo_max_token_len_per_gpu: int = setting(8192, "Token budget per micro-batch when use_dynamic_bsz is true.")
    fsdp_config: FSDPConfig = section(FSDPConfig)
    optim_state_dtype: str = setting(
        "float32", "dtype of AdamW's two moment estimates: float32 | bfloat16 (halves optimiser memory; the update "
        "itself is computed in float32).", choices=("float32", "bfloat16"))
    compute_weight_copy: bool = setting(
        False, "Run the log-prob pass and the update on a copy of the weights in fsdp_config.dtype (bfloat16 or "
        "float16), kept equal to the float32 weights after every optimiser step; the gradients are summed into the "
        "float32 weights, which the optimiser, checkpoints and the rollout sync use as before. Saves casting every "
        "weight in every micro-batch, and the residual stream stays in that dtype as under FSDP mixed precision "
        "(0.75-0.9x the update's time on 2 CPU cores, docs/results.md); costs that copy's memory. Not with LoRA, "
        "FSDP sharding (several ranks) or offload.")
    tis_cap: float | None = setting(
        None, "Truncated importance sampling (TIS, as verl/SkyRL): weight each token's policy loss by "
        "min(pi_old / pi_rollout, tis_cap), detached, correcting for the rollout engine sampling from a slightly "
        "different distribution than the trainer's (kernels, dtype). null = off; 2 is a common cap.", low=1,
        null_means="off")
    share_prompt_prefix: bool = setting(
        True, "Run the prompt tokens a micro-batch's rows all start with once per forward and serve every row from "
        "their keys and values (the actor's passes and update, the reference): the same log-probs and gradients to "
        "float rounding, fewer tokens computed (a GRPO group shares its whole prompt; verl/workers/shared_prefix.py). "
        "Off under gradient checkpointing (no cache in training) and for a model sharded with FSDP (ranks or "
        "offload), whose freed weights a backward through two forward calls cannot use.")


@dataclass
class ValKwargs:
    temperature: float = setting(0.0, "Validation temperature (0 = greedy).", low=0, high=10,
                                 what="a sampling temperature (0 = greedy)")
    top_p: float = setting(1.0, "Validation top-p.", low=0, high=1, low_open=True)
    top_k: int = setting(-1, "Validation top-k (-1 = off).", low=1, off=-1)
    n: int = setting(1, "Validation samples per prompt.", low=1)


@dataclass
class MultiTurnConfig:
    format: str | None = setting(
        None, "How the policy acts in the recipe's agent loop: one of the action formats the recipe and plug-ins "
        "register ({choices}; docs/design.md, \"Action formats\").", choices=format_names,
        null_means="the recipe's DEFAULT_FORMAT")
    tool_config_path: str | None = setting(
        None, "A format with tools: YAML declaring the tools (verl's shape: tools: [{class_name, config, tool_schema: "
        "{type: function, function: {name, description, parameters}}}]); class_name is a registered tool class or "
        "module.Class. See configs/tools/.", null_means="the recipe's default tools (its DEFAULT_TOOLS)")
    max_assistant_turns: int | None = setting(
        None, "Assistant turns per trajectory, the last of which is final (its calls are not executed). Replaces "
        "max_turns + 1 when set.", low=1, null_means="max_turns + 1")
    max_tool_response_length: int | None = setting(
        None, "A format with tools: tokens of one tool result; a longer one (a page opened whole) is cut, with a "
        "notice the policy reads.", low=1, null_means="data.max_obs_length")
    max_parallel_calls: int = setting(
        4, "A format with tools: tool calls executed per turn, concurrently; further calls of the turn get an error "
        "message (agent/invalid_calls).", low=1)


@dataclass
class RolloutConfig:
    name: str = setting(
        "hf", "Generation engine, one per actor rank, colocated with the rank's FSDP shard: vllm (vllm.LLM inside the "
        "worker) | hf (transformers generate). hf is the default because it is faster for the tiny demo policy on CPU "
        "in one process (benchmarks/bench_ppo_step.py); use vllm for real models, on GPUs and on CPU (a GRPO step of "
        "SmolLM2-135M on 2 cores: about half the HF engine's, benchmarks/bench_real_step.py).", choices=("vllm", "hf"))
    temperature: float = setting(1.0, "Sampling temperature for training rollouts (0 = greedy).", low=0, high=10,
                                 what="a sampling temperature (0 = greedy)")
    top_p: float = setting(1.0, "Nucleus sampling threshold (1.0 = off).", low=0, high=1)
    top_k: int = setting(-1, "Top-k sampling (-1 = off).", low=1, off=-1)
    n: int = setting(1, "Samples per prompt (GRPO/RLOO group size; 1 for PPO with a critic).", low=1,
                     spellings=(Alias("actor_rollout_ref.rollout.n_agent", _N_AGENT_NOTE),))
    dtype: str = setting(
        "float32", "Model dtype in the rollout engine only (and of the weights synced into it): float32 | bfloat16 | "
        "float16. Training precision is actor.fsdp_config.dtype / critic.model.fsdp_config.dtype.",
        choices=DTYPE_NAMES)
    gpu_memory_utilization: float = setting(
        0.5, "vLLM: fraction of GPU memory for weights + KV cache (GPU only).", low=0, high=1, low_open=True,
        what="a fraction of the GPU's memory")
    cpu_kv_cache_gb: float = setting(1.0, "vLLM: GiB of CPU memory for the KV cache (CPU backend only).", low=0,
                                     low_open=True, what="GiB of KV cache")
    max_num_seqs: int = setting(256, "vLLM: maximum sequences scheduled at once.")
    enforce_eager: bool = setting(
        True, "vLLM: run the model eagerly (true, as verl and Search-R1) or compiled by torch.compile, with CUDA "
        "graphs on a GPU (false). Compiling costs 1-2 min when the engine starts (SmolLM2-135M on 2 CPU cores) and "
        "speeds up decoding: there one row decoded 1.45x as fast, and make demo-real's GRPO step took 0.63x the eager "
        "engine's median time on one seed (docs/history/results-journal.md, \"vLLM's model compiled\").")
    free_cache_engine: bool = setting(
        False, "Release the rollout's KV cache after each generate call, so training can use its memory: vLLM's sleep "
        "mode (GPU only), the hf engine's static cache (and its CUDA graph, captured again on the next call).")
    micro_batch_size: int = setting(64, "Rows per HF generate call (hf rollout only).", low=1)
    hf_kv_cache: str = setting(
        "auto", "hf: the decode loop's KV cache ({choices}): dynamic = transformers' growing cache, rows that end "
        "leave the batch (fastest on a CPU); static = a pre-sized cache for a batch padded to a power of two, whose "
        "decode step is captured as a CUDA graph on a GPU (hf_cuda_graphs); auto = static on a GPU, dynamic on a CPU. "
        "docs/design.md, \"The HF engine's decode loop\".", choices=("auto", "dynamic", "static"))
    hf_cuda_graphs: bool = setting(
        True, "hf on a GPU with the static cache: capture the decode step as a CUDA graph (one launch a token instead "
        "of the model's hundreds); a capture that fails logs why and decodes without graphs.")
    log_prob_micro_batch_size_per_gpu: int = setting(
        16, "Trajectories per forward pass on each rank when the actor computes log-probs.", low=1,
        spellings=(GlobalCount("actor_rollout_ref.rollout.log_prob_micro_batch_size"),))
    tensor_model_parallel_size: int = setting(
        1, "vLLM: ranks per tensor-parallel engine. Ranks [0, tp), [tp, 2 tp), ... each serve one engine; rows are "
        "split over world / tp such groups. Must divide the world size; 1 with the hf engine.", low=1)
    mode: str = setting(
        "sync", "How the recipe's agent loop (verl/agent/loop.py) shares the "
        "engines and its environment: sync = lockstep turns (one engine call per turn for all active rows, then one "
        "environment call, e.g. retrieval, for all of them; a row waits for the slowest row of its turn) | async = "
        "every row runs its own turns: it goes to the environment as soon as its turn ends and back to an engine as "
        "soon as its observation is in, engines batch whatever is pending (docs/design.md, \"Asynchronous "
        "rollout\").", choices=("sync", "async"))
    async_chunk_tokens: int = setting(
        0, "async: tokens each row may sample per engine round; a row not done by then continues in the next round, "
        "so a short turn waits at most this long for a long one (0 = each round runs its rows' whole turns).", low=0)
    partial: bool = setting(
        False, "trainer.max_staleness >= 1: at a weight sync, rows being generated continue on the new weights (true; "
        "each token records its version) or the sync waits until they finish on the weights they started with "
        "(false).")
    val_kwargs: ValKwargs = section(ValKwargs, "Sampling for validation: greedy by default.")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, "The recipe's multi-turn loop: action format and tools.")


@dataclass
class RefFSDPConfig:
    param_offload: bool = setting(
        False, "Keep the reference model's parameters in host memory (FSDP2 CPUOffloadPolicy), moved in per use.")
    dtype: str = setting(
        "${actor_rollout_ref.actor.fsdp_config.dtype}", "dtype the frozen reference is loaded and run in: float32 | "
        "bfloat16 | float16 (bfloat16 halves its memory). Default: the actor's training dtype. Under LoRA the "
        "reference is the actor itself (its dtype).", choices=DTYPE_NAMES)


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = setting(
        16, "Trajectories per forward pass on each rank of the frozen reference model.", low=1,
        spellings=(GlobalCount("actor_rollout_ref.ref.log_prob_micro_batch_size"),))
    fsdp_config: RefFSDPConfig = section(RefFSDPConfig)


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = section(ModelConfig)
    actor: ActorConfig = section(ActorConfig)
    rollout: RolloutConfig = section(RolloutConfig)
    ref: RefConfig = section(RefConfig)


@dataclass
class CriticModelConfig:
    path: str | None = setting(None, "Critic backbone directory; null = actor_rollout_ref.model.path.",
                               spellings=(Alias("critic.model_path", RENAMED),))
    enable_gradient_checkpointing: bool | None = setting(
        None, "Recompute activations in the backward pass; null = on for models above 1B parameters.")
    fsdp_config: FSDPConfig = section(FSDPConfig)


@dataclass
class CriticConfig:
    model: CriticModelConfig = section(CriticModelConfig)
    optim: OptimConfig = section(OptimConfig, lr=1e-5)
    ppo_mini_batch_size: int = setting(32, "Trajectories per critic optimiser step, over all ranks.", low=1)
    ppo_micro_batch_size_per_gpu: int = setting(
        8, "Trajectories per critic forward/backward pass on each rank (also the value pass).", low=1,
        spellings=(GlobalCount("critic.ppo_micro_batch_size"),))
    ppo_epochs: int = setting(1, "Passes of the critic over the step's batch.", low=1)
    use_dynamic_bsz: bool | None = setting(
        None, "Pack the critic's micro-batches (value pass and update) by token count instead of by row count, as "
        "the actor's use_dynamic_bsz does; null = actor_rollout_ref.actor.use_dynamic_bsz.",
        null_means="the actor's use_dynamic_bsz")
    ppo_max_token_len_per_gpu: int | None = setting(
        None, "Token budget per critic micro-batch when the critic packs by tokens; null = "
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu.", low=1, null_means="the actor's token budget",
        what="a token budget")
    grad_clip: float | None = setting(1.0, "Maximum critic gradient norm; null = no clipping.", low=0, low_open=True,
                                      null_means="no clipping", what="a gradient-norm bound")
    cliprange_value: float = setting(0.5, "Value clipping range around the old values.", low=0, low_open=True,
                                     what="the value clip range")
    value_loss_coef: float = setting(0.5, "Weight of the value loss.", low=0)
    compute_weight_copy: bool = setting(
        False, "Run the value pass and the update on a copy of the critic's weights in model.fsdp_config.dtype "
        "(bfloat16 or float16), as actor_rollout_ref.actor.compute_weight_copy does for the actor: the gradients "
        "are summed into the float32 weights, which the optimiser and checkpoints use. Not with FSDP sharding "
        "(several ranks) or offload.")


@dataclass
class CustomRewardConfig:
    path: str | None = setting(None, "Python file defining a reward function; null = the recipe's score.")
    name: str = setting(
        "compute_score", "Name of the function in that file: fn(data_source, solution_str, ground_truth, "
        "extra_info) -> float.")


@dataclass
class TrainerConfig(RunConfig):
    """The run's keys (``RunConfig``, shared with the SFT trainer), then the RL trainer's own."""

    backend: str = setting("local", "Worker placement: local (in-process) | ray (Ray actors on a resource pool).",
                           choices=("local", "ray"))
    ray_timeout_s: float = setting(
        30.0, "Seconds to wait for the Ray cluster RAY_ADDRESS names (trainer.backend=ray, or a recipe's service on "
        "Ray) before the run stops with an error naming the address; Ray itself would wait for ever.", low=0,
        low_open=True, what="seconds", steers=True)
    nnodes: int = setting(1, "Nodes in the Ray resource pool.", low=1)
    n_gpus_per_node: int = setting(1, "Workers per node (GPUs per node; CPU worker processes when there is no GPU).",
                                   low=1)
    critic_warmup: int = setting(
        0, "Steps that train the critic only: the actor is updated from step critic_warmup on (verl's rule; 0 or 1 = "
        "from the first step).", low=0)
    max_staleness: int = setting(
        0, "Bounded off-policy pipeline: 0 = each batch is generated after the previous step's update (on-policy); "
        "k >= 1 = batches are generated while earlier steps train, by weights at most k updates older than the "
        "policy they train (needs actor.tis_cap; verl/trainer/pipeline.py). Rows beyond the bound are never trained "
        "on.", low=0)
    rollout_ranks: int = setting(
        0, "Disaggregated placement (Ray): this many of the nnodes x n_gpus_per_node ranks only generate (engines, "
        "no training), the rest only train; weights go from training rank 0 to them directly (a gloo broadcast, "
        "never through the driver). 0 = every training rank also hosts an engine (colocated).")
    rollout_data_dir: str | None = setting(
        None, "Where each training step's trajectories are kept, as <dir>/<step>.jsonl (prompt, response in "
        "policy / inserted segments, queries, answer, score, reward terms, advantage, stop reason, policy versions; "
        "docs/design.md, Trajectory records). null = <run directory>/rollouts.", null_means="<run directory>/rollouts",
        steers=True)
    rollout_data_rows: int = setting(
        64, "Rows of each training step kept there: whole groups (a prompt's samples together) spread over the "
        "batch; all rows when the batch has no more. 0 = none kept.", low=0, steers=True)
    validation_data_dir: str | None = setting(
        None, "Where each validation's generations are kept, as <dir>/<step>.jsonl (the same records; step 0 = before "
        "training). null = <run directory>/validation.", null_means="<run directory>/validation", steers=True)
    validation_data_rows: int = setting(
        512, "Rows of each validation kept there (whole groups, spread over the validation set; all when it has no "
        "more). 0 = none kept.", low=0, steers=True)
    val_before_train: bool = setting(True, "Validate once before the first step.", steers=True)
    val_only: bool = setting(
        False, "Only validate (the policy at actor_rollout_ref.model.path or the resumed checkpoint), then exit.",
        steers=True)
    peak_tflops: float | None = setting(
        None, "One device's dense matmul peak in TFLOP/s, the denominator of perf/mfu/*; null = measured on rank 0 at "
        "start-up in each pass's dtype (benchmarks/bench_peak.py prints it).", low=0, low_open=True,
        null_means="measured at start-up", what="a matmul rate")
    max_skipped_updates: int = setting(
        3, "Stop the run after this many training steps in a row whose update was skipped because a loss, gradient "
        "norm or advantage was NaN/Inf (a skipped update never changes the weights; each is counted in "
        "actor/skipped_updates).", low=1, steers=True)
    max_skipped_share: float = setting(
        0.5, "Also stop once more than this share of the steps run so far had their update skipped (counted from "
        "trainer.max_skipped_updates skipped steps on), in a row or not.", low=0, high=1, low_open=True,
        what="a share of the steps", steers=True)
    alarm_entropy_fraction: float = setting(
        0.1, "Health alarm (console warning + health/entropy_collapse = 1): mean policy entropy below this fraction of "
        "the run's starting entropy (the mean over its first trainer.alarm_baseline_steps steps): relative, so a run "
        "from a sharp SFT checkpoint is not a collapse; a healthy run may end far below its start (make demo-real's "
        "GRPO: 1.54 -> 0.25 nats). 0 = off.", low=0, high=1, what="a fraction of the starting "
        "entropy", steers=True)
    alarm_baseline_steps: int = setting(
        3, "Steps whose mean entropy is the run's starting entropy (trainer.alarm_entropy_fraction; no relative "
        "entropy alarm before them).", low=1, steers=True)
    alarm_entropy_below: float | None = setting(
        None, "Health alarm on an absolute floor too: mean policy entropy (nats) below this, at any step; null = "
        "no floor (the relative alarm only).", low=0, null_means="no floor", steers=True)
    alarm_clipfrac_above: float = setting(
        0.5, "Health alarm (console warning + health/clipfrac_explosion = 1): PPO clip fraction above this.",
        steers=True)
    alarm_length_fraction: float = setting(
        0.5, "Health alarm length_collapse: mean response length (response_length/mean) below this fraction of the "
        "run's starting length (its first trainer.alarm_baseline_steps steps). 0 = off.", low=0, high=1,
        what="a fraction of the starting length", steers=True)
    alarm_overlong_above: float = setting(
        0.5, "Health alarm length_budget: share of a step's trajectories cut by the length budget "
        "(train/overlong_frac) above this.", low=0, high=1, what="a share of the trajectories", steers=True)
    alarm_valid_action_fraction: float = setting(
        0.8, "Health alarm valid_actions_falling: the share of well-formed actions (agent/valid_action_ratio) over "
        "the steps since the run's start (at most the last trainer.alarm_window) below this fraction of its "
        "starting share (the first trainer.alarm_baseline_steps steps), beyond sampling noise (95 % confidence, "
        "from the steps' turn counts, agent/turns). 0 = off.", low=0, high=1, what="a fraction of the starting share",
        steers=True)
    alarm_flat_groups_above: float = setting(
        0.9, "Health alarm flat_groups: share of a step's trajectories in groups (a prompt's samples, rollout.n >= 2) "
        "whose samples all scored the same, so their group-relative advantage is 0 (monitor/flat_groups), its mean "
        "over the last trainer.alarm_window steps above this.", low=0, high=1, what="a share of the trajectories",
        steers=True)
    alarm_kl_above: float = setting(
        0.25, "Health alarm kl_drift: the policy's KL divergence from the reference model (actor/kl_loss, or "
        "actor/reward_kl_penalty with algorithm.use_kl_in_reward) above this; the sign that comes first in a slow "
        "collapse. 0 = off.", low=0, what="a KL divergence (nats)", steers=True)
    alarm_score_rise: float = setting(
        0.1, "Health alarm score_without_<signal> (a recipe's recall signal, for example the search's retrieval "
        "hits): fires when the mean score of the last trainer.alarm_window steps rose at least this much above the "
        "run's start while the signal fell at least trainer.alarm_signal_drop below its start.", low=0,
        what="a score difference", steers=True)
    alarm_signal_drop: float = setting(
        0.2, "The fall of the recall signal that alarm needs (see trainer.alarm_score_rise).", low=0,
        what="a difference of the signal", steers=True)
    alarm_window: int = setting(
        5, "Steps averaged by the alarms that watch a noisy value: the score against the recall signal and the "
        "shares of trajectories (flat_groups, the recipe's text alarms), which fire from the step the window is "
        "full; and the valid-action share, pooled over at most this many steps.", low=1, steers=True)
    stop_on: list[str] = setting(
        [], "Health alarms that stop the run when they fire (names: entropy_collapse, clipfrac_explosion, "
        "length_collapse, length_budget, valid_actions_falling, flat_groups, kl_drift and the recipe's own, listed in "
        "the error a wrong name gets): the step is logged and saved as a checkpoint, then the run exits 3; the same "
        "command (without the name here, to train on) resumes from that checkpoint. [] = alarms only warn.",
        steers=True)
