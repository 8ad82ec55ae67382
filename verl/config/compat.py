"""Other trainers' spellings of our config keys, so that Search-R1's and verl's launch scripts run as written.

A config holds one name per setting, verl's (``actor_rollout_ref.actor.optim.lr``,
``...fsdp_config.param_offload``, ``..._micro_batch_size_per_gpu``). Users arrive with Search-R1's
``train_ppo.sh`` / ``train_grpo.sh`` (an older verl: global micro-batch sizes, ``rollout.n_agent``,
``data.shuffle_train_dataloader``, Hydra's ``+key=value``) or with a verl walkthrough's keys. ``translate``
turns each ``key=value`` into ours before the config is merged, with three kinds of rule:

* ``Alias``: another spelling of a setting, declared on the setting itself (``setting(..., spellings=(Alias(...),))``,
  ``verl.config.schema``); the value is used as given, or through the alias's ``values`` map where their setting
  is spelled differently (verl's ``reward_model.overlong_buffer.enable=true`` is
  ``algorithm.overlong.mode=soft_penalty``); a value outside that map is an error naming the allowed ones.
* ``GlobalCount``: a global micro-batch size (Search-R1 and older verl divide it by the number of ranks), declared
  on our per-rank setting; the count is divided by the world size once the config is loaded.
* ``NoEffect``: a key that names no setting here and changes nothing in this trainer (HDFS upload, CUDA graphs,
  profilers, ...); accepted with a one-line notice saying why. These are the one table of this module
  (``NO_EFFECT``, the RL config's ``no_effect_keys``): they have no field to be declared on. Where a value would
  ask for something this trainer does not do (``actor.strategy=megatron``, ``algorithm.no_think_rl=true``),
  ``allowed`` lists what it does, and any other value is an error naming the key.

``rules(schema)`` builds the map from every key spelled another way to its rule, from the declarations of the
config class ``schema`` and its ``no_effect_keys``; a spelling declared twice, or one that is a key of the config,
is an error there. Two spellings of one setting in one command line with different values are an error (which one was
meant cannot be known). Units: ``ppo_mini_batch_size`` counts trajectories (prompts x ``rollout.n``), as Search-R1
counts it with ``n_agent`` (its ``rollout.n`` stays 1); today's verl counts prompts and multiplies by
``rollout.n``. See docs/config.md. The SFT config (``verl.config.sft``) shares the RL config's optimiser and run
sections, so verl's SFT names of their keys (``optim.lr_scheduler``, ``optim.warmup_steps_ratio``) are
``Alias``es declared there too; docs/config_sft.md lists them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from verl.config.schema import leaves

RENAMED = "renamed: {to}"  # the note of an Alias that is a key's older name (said once when it is used)


class CompatError(ValueError):
    """A foreign key with a value this trainer cannot honour; the message names the key and what is allowed."""


@dataclass(frozen=True)
class Alias:
    """Another spelling of the setting it is declared on. A ``key`` starting with ``../`` is relative to the
    section that holds the setting's section: ``../lr`` on ``OptimConfig.lr`` is ``actor_rollout_ref.actor.lr``
    and ``critic.lr`` (the keys before ``optim`` existed). ``to`` is filled in by ``rules``."""

    key: str
    note: str = ""  # said once when the spelling is used ("" = silent: a plain synonym); "{to}" = our key
    values: dict[Any, Any] | None = None  # their value -> ours; None = the value as given
    to: str = ""


@dataclass(frozen=True)
class GlobalCount:
    """A global count (over all ranks) of the per-rank setting it is declared on."""

    key: str
    to: str = ""


@dataclass(frozen=True)
class NoEffect:
    why: str
    allowed: tuple | None = None  # values that describe what this trainer does; None = any value


_PAD = ("this trainer cuts the columns that are padding in every row of a micro-batch before each forward; there is "
        "no separate unpadded (varlen) path, and results are the same")
_NO_PROFILER = "this trainer has no profiler integration; timing/* metrics are logged every step"
_WRAP = "FSDP2 wraps each decoder layer (the model's _no_split_modules) and then the root"

NO_EFFECT: dict[str, NoEffect] = {
    # ---- Search-R1's train_ppo.sh / train_grpo.sh (verl of early 2025)
    "actor_rollout_ref.model.use_remove_padding": NoEffect(_PAD),
    "critic.model.use_remove_padding": NoEffect(_PAD),
    "algorithm.no_think_rl": NoEffect("Search-R1 raises an error when it is true; false is what every run does",
                                      (False,)),
    "trainer.default_hdfs_dir": NoEffect("there is no HDFS upload; checkpoints stay in trainer.default_local_dir"),
    # ---- today's verl keys (the config walkthrough) that change nothing here, or only one value of which does
    "actor_rollout_ref.hybrid_engine": NoEffect("every actor rank hosts its rollout engine", (True,)),
    "actor_rollout_ref.model.external_lib": NoEffect("no external model library is imported", (None,)),
    "actor_rollout_ref.model.override_config": NoEffect("the model's config.json is used as saved", ({},)),
    "actor_rollout_ref.model.use_shm": NoEffect("models load from their directory"),
    "actor_rollout_ref.actor.strategy": NoEffect("the actor trains with FSDP2", ("fsdp", "fsdp2")),
    "critic.strategy": NoEffect("the critic trains with FSDP2", ("fsdp", "fsdp2")),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": NoEffect("no sequence parallelism", (1,)),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": NoEffect("no sequence parallelism", (1,)),
    "critic.ulysses_sequence_parallel_size": NoEffect("no sequence parallelism", (1,)),
    "actor_rollout_ref.actor.shuffle": NoEffect("mini-batches are taken in the batch's order"),
    "critic.shuffle": NoEffect("mini-batches are taken in the batch's order"),
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": NoEffect(
        "log-probs and entropy are always computed over chunks of tokens"),
    "actor_rollout_ref.actor.entropy_checkpointing": NoEffect(
        "log-probs and entropy are always computed over chunks of tokens"),
    "actor_rollout_ref.actor.optim.total_training_steps": NoEffect(
        "computed from the data and trainer.total_training_steps"),
    "critic.optim.total_training_steps": NoEffect("computed from the data and trainer.total_training_steps"),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": NoEffect("every rank holds one shard", (-1,)),
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch": NoEffect(_WRAP),
    "actor_rollout_ref.actor.fsdp_config.wrap_policy": NoEffect(_WRAP),
    "actor_rollout_ref.ref.fsdp_config.wrap_policy": NoEffect(_WRAP),
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": NoEffect("every rank holds one shard", (-1,)),
    "critic.model.fsdp_config.wrap_policy": NoEffect(_WRAP),
    "critic.model.fsdp_config.fsdp_size": NoEffect("every rank holds one shard", (-1,)),
    "critic.model.tokenizer_path": NoEffect("the critic reads the actor's token ids; it needs no tokenizer"),
    "critic.model.external_lib": NoEffect("no external model library is imported", (None,)),
    "critic.model.override_config": NoEffect("the model's config.json is used as saved", ({},)),
    "critic.forward_max_token_len_per_gpu": NoEffect("the value pass packs by critic.ppo_max_token_len_per_gpu"),
    "critic.forward_micro_batch_size": NoEffect("the value pass uses critic.ppo_micro_batch_size_per_gpu"),
    "critic.forward_micro_batch_size_per_gpu": NoEffect("the value pass uses critic.ppo_micro_batch_size_per_gpu"),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": NoEffect("follows actor_rollout_ref.actor.use_dynamic_bsz"),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": NoEffect(
        "follows actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": NoEffect("follows actor_rollout_ref.actor.use_dynamic_bsz"),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": NoEffect(
        "follows actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
    "actor_rollout_ref.rollout.prompt_length": NoEffect("a turn's context budget is data.max_prompt_length"),
    "actor_rollout_ref.rollout.response_length": NoEffect("a turn's budget is data.max_response_length"),
    "actor_rollout_ref.rollout.ignore_eos": NoEffect("generation stops at EOS and at </search> / </answer>", (False,)),
    "actor_rollout_ref.rollout.multi_turn.enable": NoEffect("the recipe's loop is multi-turn in either "
                                                           "multi_turn.format", (True,)),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": NoEffect(
        "a chat-template tool-call format's sanity check always runs and reports a mismatch "
        "(agent/tokenization_mismatch and a warning)"),
    "actor_rollout_ref.rollout.load_format": NoEffect("engines load the policy directory, then receive the trainer's "
                                                      "weights in memory after every update"),
    "actor_rollout_ref.rollout.max_num_batched_tokens": NoEffect("vLLM's own default is used"),
    "actor_rollout_ref.rollout.enable_chunked_prefill": NoEffect("vLLM's own default is used"),
    "actor_rollout_ref.rollout.disable_log_stats": NoEffect("vLLM's statistics log is off"),
    "actor_rollout_ref.rollout.calculate_log_probs": NoEffect(
        "the engines always return the sampled tokens' log-probs (rollout/* mismatch metrics)"),
    "actor_rollout_ref.rollout.do_sample": NoEffect("sampling is set by rollout.temperature (0 = greedy)", (True,)),
    "actor_rollout_ref.profiler": NoEffect(_NO_PROFILER),
    "trainer.profile_steps": NoEffect(_NO_PROFILER),
    "trainer.controller_nsight_options": NoEffect(_NO_PROFILER),
    "trainer.worker_nsight_options": NoEffect(_NO_PROFILER),
    "ray_init.timeline_json_file": NoEffect(_NO_PROFILER),
    "ray_init.num_cpus": NoEffect("Ray starts with the machine's CPUs (a cluster's address comes from RAY_ADDRESS)"),
    "data.tokenizer": NoEffect("the tokenizer is the policy's (actor_rollout_ref.model.path)", (None,)),
    "data.return_raw_input_ids": NoEffect("the reward reads the decoded response; no second tokenizer"),
    "data.return_raw_chat": NoEffect("prompts are chat-templated once, with the policy's tokenizer"),
    "reward_model.enable": NoEffect("rewards are the recipe's score or custom_reward_function; no reward model",
                                    (False,)),
    # (verl's DAPO recipe spells the soft overlong punishment reward_model.overlong_buffer.*: declared on
    # algorithm.overlong's settings; the rest of reward_model is covered by the rule below)
    "reward_model.overlong_buffer.log": NoEffect("train/overlong_frac, train/overlong_masked and (soft_penalty) "
                                                 "train/overlong_penalty are logged every step"),
    "reward_model": NoEffect("rewards are the recipe's score or custom_reward_function; no reward model"),
    "algorithm.state_masking": NoEffect("inserted tokens are masked by where they came from (info_mask), not by "
                                        "markers; actor_rollout_ref.actor.state_masking switches it"),
}


def _absolute(spelling: str, ours: str) -> str:
    """``spelling`` as a full key: ``../x`` declared on ``a.b.c.d`` is ``a.b.x``; a key without ``../`` is full."""
    if not spelling.startswith("../"):
        return spelling
    parts = ours.split(".")[:-1]
    while spelling.startswith("../"):
        spelling, parts = spelling[3:], parts[:-1]
    return ".".join([*parts, spelling])


@functools.cache
def rules(schema: type) -> dict[str, Alias | GlobalCount | NoEffect]:
    """Every other spelling accepted for the config class ``schema``: the ``spellings`` declared on its settings
    (``to`` filled in), then the keys its class attribute ``no_effect_keys`` accepts and ignores (the RL config's
    are ``NO_EFFECT``; the SFT config has none). ValueError for a spelling declared twice or that is a key of the
    config (it would hide the key)."""
    no_effect: dict[str, NoEffect] = schema.no_effect_keys
    found: dict[str, Alias | GlobalCount | NoEffect] = {}
    keys = {leaf.key for leaf in leaves(schema())}
    for leaf in leaves(schema()):
        for spelling in leaf.setting.spellings if leaf.setting else ():
            key = _absolute(spelling.key, leaf.key)
            if key in found or key in keys:
                raise ValueError(f"the spelling {key} (declared on {leaf.key}) is declared twice or is a key of "
                                 f"{schema.__name__}")
            note = {"note": spelling.note.replace("{to}", leaf.key)} if isinstance(spelling, Alias) else {}
            found[key] = dataclasses.replace(spelling, key=key, to=leaf.key, **note)
    clash = sorted((found.keys() | keys) & no_effect.keys())
    if clash:
        raise ValueError(f"{schema.__name__}.no_effect_keys names keys that are its settings or spellings: {clash}")
    return {**found, **no_effect}


def renamed_keys(schema: type) -> dict[str, str]:
    """Other spelling -> our key, for every ``Alias`` of ``schema`` that takes the value as given: how a config
    saved under those names (a run made before a key was renamed) reads now (``verl.utils.run_dir.claim``)."""
    return {key: rule.to for key, rule in rules(schema).items() if isinstance(rule, Alias) and rule.values is None}


def mapping(values: dict[Any, Any], ours: str) -> str:
    """``values`` of an ``Alias`` in words: ``True = algorithm.overlong.mode=soft_penalty, False = ...``."""
    return ", ".join(f"{theirs!r} = {ours}={value}" for theirs, value in values.items())


@dataclass
class Translated:
    """Our spelling of a list of overrides."""

    items: list[tuple[str, Any]] = field(default_factory=list)  # (our key, value), in order
    global_counts: dict[str, tuple[str, int]] = field(default_factory=dict)  # our key -> (their key, global count)
    notices: list[str] = field(default_factory=list)
    given_as: dict[str, str] = field(default_factory=dict)  # our key -> the other spelling that set it (for errors)


def _rule(key: str, table: dict[str, Alias | GlobalCount | NoEffect]) -> Alias | GlobalCount | NoEffect | None:
    """The rule for ``key`` or for the nearest enclosing key that has one (a NoEffect covers its subtree)."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        rule = table.get(".".join(parts[:end]))
        if rule is not None and (end == len(parts) or isinstance(rule, NoEffect)):
            return rule
    return None


def strip_hydra_prefix(key: str) -> str:
    """Hydra's ``+key`` (append) and ``++key`` (append or override) name keys that exist here: same key."""
    if key.startswith("~"):
        raise CompatError(f"override {key!r}: deleting keys (Hydra's ~key) is not supported; every key has a value")
    return key.lstrip("+")


def translate(pairs: list[tuple[str, Any]], table: dict[str, Alias | GlobalCount | NoEffect]) -> Translated:
    """Map ``(key, value)`` pairs (parsed overrides, in order) to our keys by the rules ``table`` (``rules``); see
    the module docstring."""
    out = Translated()
    spelled_by: dict[str, tuple[str, Any, Any]] = {}  # our key -> (the spelling that set it, value, value as given)
    for raw_key, value in pairs:
        given = value
        key = strip_hydra_prefix(raw_key)
        rule = _rule(key, table)
        if rule is None:
            ours = key
        elif isinstance(rule, NoEffect):
            if rule.allowed is not None and value not in rule.allowed:
                allowed = ", ".join("null" if v is None else repr(v) for v in rule.allowed)
                raise CompatError(f"config key {key}={value!r} is not supported here: {rule.why} (allowed: {allowed})")
            out.notices.append(f"{key} has no effect here: {rule.why}")
            continue
        elif isinstance(rule, GlobalCount):
            out.global_counts[rule.to] = (key, int(value))
            continue
        else:
            ours = rule.to
            if rule.note:
                out.notices.append(f"{key}: {rule.note}")
            if rule.values is not None:
                if value not in rule.values:
                    raise CompatError(f"config key {key}={value!r} is invalid: allowed "
                                      f"{', '.join(repr(v) for v in rule.values)} ({mapping(rule.values, ours)})")
                value = rule.values[value]
        earlier = spelled_by.get(ours)
        if earlier is not None and earlier[0] != key and earlier[1] != value:
            raise CompatError(f"config keys {earlier[0]}={earlier[2]!r} and {key}={given!r} set the same setting "
                              f"({ours}) to different values: give one of them")
        spelled_by[ours] = (key, value, given)
        out.items.append((ours, value))
        if ours != key:
            out.given_as[ours] = key
        else:
            out.given_as.pop(ours, None)
    return out
