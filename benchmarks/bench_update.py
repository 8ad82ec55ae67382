"""The actor's training passes on a model: log-prob pass and PPO update, tokens/s and MFU (figures, never pass/fail).

    python benchmarks/bench_update.py --model DIR [--random-weights] [--device cpu|cuda] [--dtype float32]
                                      [--rows 16] [--prompt-tokens 200] [--response-tokens 300]
                                      [--micro-batch 4] [--repeats 3] [--group N [--compare-prefix]]
                                      [--compare-head] [--compare-copy] [--compare-critic-copy]
                                      [--inserted-every 3] [key=value ...]

One ``ActorWorker`` (the trainer's own, built from the trainer's config with the given overrides) on ``--device``,
compute dtype ``--dtype`` (weights and optimiser in float32, as in training). A batch of ``--rows`` rows of random
token ids (``--prompt-tokens`` prompt, ``--response-tokens`` response of which every third 20-token block is an
inserted, masked block, by default) with random advantages, and per repeat, timed: the old-log-prob pass
(``compute_log_prob``), an update that reads those old log-probs, and an on-policy update without them (one epoch,
one mini-batch: the trainer then skips the pass, ``config.recomputes_old_log_probs``). Tokens/s counts every token
of every row (prompt and response); MFU = model FLOPs (``verl.workers.flops``: 1 forward for the pass, 3 for an
update) over the time and the device's measured matmul peak in ``--dtype``. Medians after one warm-up.
``--random-weights`` keeps ``--model``'s config and draws new weights (the speed of a real model's shape).
``--group N``: consecutive groups of N rows share their prompt, as a GRPO group's do; ``--compare-prefix`` then
times the log-prob pass and the on-policy update with that prompt run once per micro-batch and in full
(``actor.share_prompt_prefix``), alternated on the same batch. ``--compare-head`` times them with the LM head on
the tokens a loss or metric reads and on every response token (``verl/workers/scored_tokens.py``), alternated;
``--inserted-every N`` makes every N-th 20-token block inserted text (default 3: a third of the response).
``--compare-copy`` times them on the trained float32 weights under autocast and on a copy of the weights in
``--dtype`` (``actor.compute_weight_copy``, ``verl/workers/weight_copy.py``), two workers from the same weights,
alternated; and prints how far the copy's log-probs are from the autocast ones on the first pass.
``--compare-critic-copy`` does the same for the critic (``critic.compute_weight_copy``; PPO's value model, a
token-classification head on ``--model``): its value pass and update, with random returns and old values.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verl.config import load_config  # noqa: E402
from verl.protocol import Batch  # noqa: E402
from verl.utils.seq import pack_trajectories  # noqa: E402
from verl.workers.actor import ActorWorker  # noqa: E402
from verl.workers.critic import CriticWorker  # noqa: E402
from verl.workers.flops import ModelFlops, measure_peak_flops  # noqa: E402


def make_batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0, group: int = 1,
               inserted_every: int = 3) -> Batch:
    """Random rows; every ``inserted_every``-th 20-token block of a response inserted (info mask 0); with ``group``
    > 1 consecutive groups of that many rows share their prompt (a GRPO group)."""
    rng = random.Random(seed)
    prompts = []
    for i in range(rows):
        prompts.append(prompts[-1] if i % group else [rng.randrange(10, vocab) for _ in range(prompt)])
    responses = [[rng.randrange(10, vocab) for _ in range(response)] for _ in range(rows)]
    info = [[0 if (t // 20) % inserted_every == inserted_every - 1 else 1 for t in range(response)]
            for _ in range(rows)]
    tensors = pack_trajectories(prompts, responses, info, pad_id=0)
    tensors["loss_mask"] = tensors["response_mask"] * tensors["info_mask"]
    gen = torch.Generator().manual_seed(seed)
    for key in ("advantages", "returns", "values"):  # the actor's and the critic's targets
        tensors[key] = torch.randn(tensors["responses"].shape, generator=gen)
    return Batch(tensors)


def timed(fn, device: str) -> tuple[float, object]:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


ACTOR_PASSES = (("log-prob pass", "compute_log_prob"), ("update", "update_actor"))
CRITIC_PASSES = (("value pass", "compute_values"), ("update", "update_critic"))


def compare(actor, batch: Batch, repeats: int, device: str, names: tuple[str, str], switch,
            passes: tuple[tuple[str, str], ...] = ACTOR_PASSES) -> None:
    """The pass and the on-policy update (``passes``: name, worker method) with ``switch(True)`` (named
    ``names[0]``) and ``switch(False)``, alternated on the same batch; medians and the ratio. ``switch`` returns the
    worker to time (None: ``actor``)."""
    times: dict[str, list[float]] = {}
    for rep in range(repeats + 1):
        for on in (True, False) if rep % 2 == 0 else (False, True):
            worker = switch(on) or actor
            for what, method in passes:
                seconds, _ = timed(lambda w=worker, m=method: getattr(w, m)(batch), device)
                if rep:  # the first round warms up
                    times.setdefault(f"{what}, {names[not on]}", []).append(seconds)
    for name, values in times.items():
        print(f"  {name:30s} median {statistics.median(values):7.2f} s  ({', '.join(f'{v:.1f}' for v in values)})")
    for what, _ in passes:
        ratio = statistics.median(times[f"{what}, {names[0]}"]) / statistics.median(times[f"{what}, {names[1]}"])
        print(f"  {what}: {names[0]} / {names[1]} = {ratio:.2f}x")


def compare_critic_copy(args: argparse.Namespace, overrides: list[str], model: str) -> None:
    """``--compare-critic-copy``: PPO's critic in ``--dtype`` (its micro-batches the actor's) on the float32 weights
    under autocast and on its weight copy, two workers from the same weights, alternated."""
    critic = [*overrides, "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
              f"data.train_batch_size={args.rows}", f"critic.model.fsdp_config.dtype={args.dtype}",
              f"critic.ppo_mini_batch_size={args.rows}", f"critic.ppo_micro_batch_size_per_gpu={args.micro_batch}"]
    copied, plain = (CriticWorker(load_config([*critic, f"critic.compute_weight_copy={on}"]), total_steps=100)
                     for on in ("true", "false"))
    vocab = AutoConfig.from_pretrained(model).vocab_size
    batch = make_batch(args.rows, args.prompt_tokens, args.response_tokens, vocab, inserted_every=args.inserted_every)
    compare(plain, batch, args.repeats, args.device, ("weight copy", "autocast"), lambda on: copied if on else plain,
            CRITIC_PASSES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="compute dtype (actor.fsdp_config.dtype)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--response-tokens", type=int, default=300)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group", type=int, default=1, help="consecutive rows sharing their prompt (GRPO's n)")
    parser.add_argument("--compare-prefix", action="store_true",
                        help="time the log-prob pass and the on-policy update with the shared prompt prefix run once "
                             "and in full, alternated on the same batch (actor.share_prompt_prefix)")
    parser.add_argument("--compare-head", action="store_true",
                        help="time the pass and the update with the LM head on the read tokens and on every token "
                             "(verl/workers/scored_tokens.py), alternated on the same batch")
    parser.add_argument("--compare-copy", action="store_true",
                        help="time the pass and the update on the float32 weights under autocast and on a copy of the "
                             "weights in --dtype (actor.compute_weight_copy), alternated on the same batch")
    parser.add_argument("--compare-critic-copy", action="store_true",
                        help="the same for the critic (critic.compute_weight_copy): its value pass and update")
    parser.add_argument("--inserted-every", type=int, default=3,
                        help="every N-th 20-token block of a response is inserted text (2: half the response)")
    parser.add_argument("overrides", nargs="*", help="trainer config key=value")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if args.random_weights:
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).save_pretrained(tmp)
            AutoTokenizer.from_pretrained(model).save_pretrained(tmp)
            model = tmp
        overrides = [f"actor_rollout_ref.model.path={model}", f"trainer.device={args.device}",
                     f"actor_rollout_ref.actor.fsdp_config.dtype={args.dtype}",
                     f"data.train_batch_size={args.rows // 2}", "actor_rollout_ref.rollout.n=2",
                     f"actor_rollout_ref.actor.ppo_mini_batch_size={args.rows}",
                     f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}",
                     f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro_batch}",
                     "algorithm.adv_estimator=grpo", *args.overrides]
        if args.compare_critic_copy:
            compare_critic_copy(args, overrides, model)
            return
        cfg = load_config(overrides)
        actor = ActorWorker(cfg, total_steps=100)
        copied = ActorWorker(load_config([*overrides, "actor_rollout_ref.actor.compute_weight_copy=true"]),
                             total_steps=100) if args.compare_copy else None
        flops = ModelFlops.of(actor.model)
        batch = make_batch(args.rows, args.prompt_tokens, args.response_tokens, AutoConfig.from_pretrained(model)
                           .vocab_size, group=args.group, inserted_every=args.inserted_every)
        forward = flops.forward(batch["attention_mask"].sum(-1))
        tokens = float(batch["attention_mask"].sum())
        times: dict[str, list[float]] = {"log-prob pass": [], "update (old log-probs given)": [],
                                         "update (on-policy, no pass)": []}
        if args.compare_prefix:
            compare(actor, batch, args.repeats, args.device, ("shared", "full"),
                    lambda on: setattr(actor.prefix_sharing, "enabled", on))
            return
        if copied is not None:
            scored = batch["loss_mask"].bool()
            gap = (copied.compute_log_prob(batch)["old_log_probs"] - actor.compute_log_prob(batch)["old_log_probs"])
            print(f"copy vs autocast, first pass: |log-prob difference| mean {gap[scored].abs().mean():.4f}, "
                  f"max {gap[scored].abs().max():.4f} over {int(scored.sum())} scored tokens")
            compare(actor, batch, args.repeats, args.device, ("weight copy", "autocast"),
                    lambda on: copied if on else actor)
            return
        if args.compare_head:
            compare(actor, batch, args.repeats, args.device, ("read tokens", "every token"),
                    lambda on: setattr(actor.prefix_sharing, "every_token", not on))
            return
        for rep in range(args.repeats + 1):
            pass_s, old = timed(lambda: actor.compute_log_prob(batch), args.device)
            with_old = Batch({**batch.tensors, "old_log_probs": old["old_log_probs"]})
            update_s, _ = timed(lambda b=with_old: actor.update_actor(b), args.device)
            fused_s, _ = timed(lambda: actor.update_actor(batch), args.device)
            if rep:
                for name, s in zip(times, (pass_s, update_s, fused_s), strict=True):
                    times[name].append(s)
        peak = measure_peak_flops(args.device, args.dtype)
    print(f"{args.rows} rows x {args.prompt_tokens} + {args.response_tokens} tokens, micro-batch {args.micro_batch}, "
          f"{args.device} {args.dtype}, torch threads {torch.get_num_threads()}, matmul peak {peak / 1e12:.2f} "
          f"TFLOP/s, {flops.linear_weights / 1e6:.1f}M linear weights, median of {args.repeats}")
    for name, values in times.items():
        s = statistics.median(values)
        forwards = 1 if name == "log-prob pass" else 3
        print(f"  {name:30s} {s:8.3f} s  {tokens / s:10.0f} tokens/s  MFU {forwards * forward / (s * peak):6.2%}")
    full = statistics.median(times["log-prob pass"]) + statistics.median(times["update (old log-probs given)"])
    print(f"  on-policy step saves {full - statistics.median(times['update (on-policy, no pass)']):.3f} s of "
          f"{full:.3f} s (pass + update)")


if __name__ == "__main__":
    main()
