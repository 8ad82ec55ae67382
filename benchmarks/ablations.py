"""The paper's ablations in miniature, on the embedded demo: RL algorithm, state masking, search at test time.

    python benchmarks/ablations.py [--seeds 0 1 2] [--variants ppo grpo ...]  (default: all below)
        [--out outputs/ablations] [--retriever-url http://127.0.0.1:8000]      (or: make ablations)

For every seed the WHOLE pipeline is re-run: the warm start of the tiny policy (``data_prep.tiny_policy
--seed S``: its scripted trajectories, tokenizer, initialisation and batches), then each RL variant from that
policy with ``trainer.seed=S+1 data.seed=S+1`` (rollout sampling, data order; seed 0 is then exactly
``make demo``, whose warm start has seed 0 and whose config has seed 1). Every trained policy, and the
warm-started one, is evaluated on the demo's test set by ``python -m search_r1.evaluate`` (greedy, the
training loop); the PPO policy also with ``do_search=false`` (every search gets an empty block). The table
gives mean +/- standard deviation over seeds of test EM (all / one-hop / two-hop) and searches per question
(one-hop / two-hop), and is written with the per-seed figures to ``OUT/ablations.md`` and ``ablations.json``.

Variants (all from the same warm start, on the same 2000 training questions):

- ``ppo``: ``make demo`` (GAE with a critic; 32 prompts per step, one sample each, one epoch = 62 steps).
- ``grpo``: ``make grpo`` (5 samples per prompt, 16 prompts per step, 40 steps, KL as a loss term).
- ``reinforce_pp``: REINFORCE++ (batch-whitened returns, no critic) with PPO's batch: 32 x 1, 62 steps.
- ``rloo``: RLOO (leave-one-out baseline) with GRPO's batch: 16 x 5, 40 steps.
- ``ppo_nomask``: ``ppo`` with ``actor_rollout_ref.actor.state_masking=false`` (retrieved tokens trained on).
- ``async``: ``ppo`` with the asynchronous rollout and the one-step-off pipeline (``rollout.mode=async``,
  ``trainer.max_staleness=1``, ``actor.tis_cap=2``): every batch after the first is sampled by the weights from
  before the previous update. Learning parity with ``ppo`` is its acceptance test (docs/results.md).
- ``grpo_ds``: ``grpo`` with dynamic sampling (``algorithm.filter_groups``, at most 3 generation rounds a step: more
  rollouts per step, counted in the table's generation rounds).
- ``grpo_turn``: GRPO plus a step advantage per search turn from the ``retrieval_hit`` term (``grpo_turn``,
  ``turn_adv_coef=1``).
- ``ppo_turn``: ``ppo`` with 0.2 x ``retrieval_hit`` added on each search turn's last token (GAE carries it back).
- ``gspo``: ``grpo`` with GSPO's sequence-level ratio and the paper's clip range and aggregation.

Order: the warm starts of all seeds, then variant by variant (``--variants ppo`` alone is the seed-robustness
check of ``make demo``). Resumable: a warm start, run or evaluation whose output is complete is not redone
(delete its directory to redo it), so an interrupted ablation continues where it stopped. ``OUT/source_hash``
records the warm-start code (the launcher's hash of ``data_prep/demo_kb.py``, ``tiny_model.py`` and
``tiny_policy.py``); an OUT built by other code is refused rather than mixed with new runs. Needs the demo
data (``data/demo``, built here when missing) and a retrieval service over its corpus (started here on the
URL's port when none answers, and stopped at the end). Time on 2 cores: 3 warm starts of 4-5 min, runs of
4-7 min (``grpo_ds`` 6-12 min: it generates 2-3 rounds a step), evaluations of 15-30 s; the five paper
variants take about 1 h 40 min, all ten (the default) about 3-3.5 h (docs/results.md, "Ablations" and
"Learning signals").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from data_prep.tiny_policy import demo_numerics_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEMO = "data/demo"
ONE_HOP, TWO_HOP = "demo_single", "demo_multi"

GROUP = ["actor_rollout_ref.rollout.n=5", "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=80",
         "trainer.total_training_steps=40", "actor_rollout_ref.actor.use_kl_loss=true"]
# Two learning signals on top of GRPO, shared with benchmarks/paper_table.py's variant rows (and make demo-real's
# VARIANT): dynamic sampling (at most 3 generation rounds a step) and retrieval-hit turn credit (grpo_turn's terms).
DYNAMIC_SAMPLING = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=3"]
TURN_CREDIT = ["reward.turn_term=retrieval_hit", "algorithm.turn_adv_coef=1.0"]
VARIANTS: dict[str, tuple[str, list[str]]] = {  # name -> (table label, trainer overrides)
    "ppo": ("PPO (GAE + critic)", ["algorithm.adv_estimator=gae"]),
    "grpo": ("GRPO", ["algorithm.adv_estimator=grpo", *GROUP]),
    "reinforce_pp": ("REINFORCE++", ["algorithm.adv_estimator=reinforce_plus_plus",
                                     "actor_rollout_ref.actor.use_kl_loss=true"]),
    "rloo": ("RLOO", ["algorithm.adv_estimator=rloo", *GROUP]),
    "ppo_nomask": ("PPO, state masking off", ["algorithm.adv_estimator=gae",
                                               "actor_rollout_ref.actor.state_masking=false"]),
    "async": ("PPO, async rollout, 1 step off-policy", [
        "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=async", "trainer.max_staleness=1",
        "actor_rollout_ref.actor.tis_cap=2"]),
    "grpo_ds": ("GRPO + dynamic sampling", ["algorithm.adv_estimator=grpo", *GROUP, *DYNAMIC_SAMPLING]),
    "grpo_turn": ("GRPO + retrieval-hit turn credit", ["algorithm.adv_estimator=grpo_turn", *GROUP, *TURN_CREDIT]),
    "ppo_turn": ("PPO + retrieval-hit turn reward", ["algorithm.adv_estimator=gae", "reward.turn_term=retrieval_hit",
                                                    "algorithm.turn_reward_coef=0.2"]),
    "gspo": ("GSPO (sequence-level ratio)", ["algorithm.adv_estimator=grpo", *GROUP,
                                             "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                                             "actor_rollout_ref.actor.clip_ratio_low=0.0003",
                                             "actor_rollout_ref.actor.clip_ratio_high=0.0004",
                                             "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"]),
}
# In-training validation (the demo's 200 test questions, as the trainer validates) every VAL_FREQ steps: the curve
# that "steps to reach PPO's final EM" is read from. Runs made before this was added have no curve ("-").
VAL_FREQ = 10
WARM_START_CODE = ("data_prep/demo_kb.py", "data_prep/tiny_model.py", "data_prep/tiny_policy.py",
                   "data_prep/warm_start_sft.py", "verl/trainer/sft_trainer.py", "verl/utils/sft_dataset.py",
                   "verl/workers/shared_prefix.py", "configs/demo_numerics.env")
COLUMNS = [("em", "test EM"), (f"em/{ONE_HOP}", "one-hop EM"), (f"em/{TWO_HOP}", "two-hop EM"),
           (f"searches/{ONE_HOP}", "searches one-hop"), (f"searches/{TWO_HOP}", "searches two-hop"),
           ("gen_rounds", "generation rounds per step")]


def source_hash() -> str:
    """sha256 of the warm-start code, the same value as ``demo_source_hash`` in scripts/launch_common.sh."""
    return hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in WARM_START_CODE)).hexdigest()


def check_source(out: Path) -> None:
    """Stamp ``out`` with the warm-start code's hash, or refuse an ``out`` whose warm starts other code built."""
    stamp, current = out / "source_hash", source_hash()
    built = sorted(out.glob("seed*/warm_start/warm_start.json"))
    recorded = stamp.read_text().strip() if stamp.exists() else None
    if built and recorded != current:
        raise SystemExit(f"[ablations] {out} holds warm starts ({built[0].parent}, ...) built by "
                         f"{'other' if recorded else 'unrecorded'} code of {', '.join(WARM_START_CODE)}; resuming "
                         f"would mix them with runs of this code. Move {out} aside or pass --out NEW_DIR.")
    stamp.write_text(current + "\n")


def run(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` in the repository root, output to ``log``; raise with the log's tail if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[ablations] {' '.join(cmd)}  (log: {log})", flush=True)
    start = time.time()
    with log.open("w") as f:
        status = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, **demo_numerics_env()}).returncode
    if status != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"exit status {status} of {' '.join(cmd)}; end of {log}:\n{tail}")
    print(f"[ablations]   done in {time.time() - start:.0f} s", flush=True)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextmanager
def retrieval_service(url: str, log: Path):
    """Use the service answering at ``url``, or start ``retrieval_launch.sh`` on its port until the block ends."""
    if healthy(url):
        yield
        return
    port = url.rsplit(":", 1)[-1].split("/")[0]
    print(f"[ablations] no retrieval service at {url}: starting retrieval_launch.sh on port {port}", flush=True)
    with log.open("w") as f:
        proc = subprocess.Popen(["bash", "retrieval_launch.sh"], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "PORT": port, "PYTHON": sys.executable})
    try:
        for _ in range(600):
            if healthy(url):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"the retrieval service exited with status {proc.returncode}; see {log}")
            time.sleep(1)
        else:
            raise RuntimeError(f"the retrieval service did not answer at {url} in 600 s; see {log}")
        yield
    finally:
        proc.terminate()
        proc.wait()


def evaluate(model: Path, out: Path, url: str, seed: int, overrides: list[str] = ()) -> dict:
    """Greedy test-set figures of ``model`` (``search_r1.evaluate``), flattened to the table's keys."""
    results = out / "results.json"
    if not results.exists():
        run([sys.executable, "-m", "search_r1.evaluate", "--model", str(model), "--data", f"{DEMO}/test.parquet",
             "--retriever-url", url, "--out", str(out), "--seed", str(seed), "--config", "configs/demo.yaml",
             *overrides],
            out.parent / f"{out.name}.log")
    report = json.loads(results.read_text())
    figures = {"em": report["overall"]["em"]}
    for source, row in report["by_source"].items():
        figures[f"em/{source}"] = row["em"]
        figures[f"searches/{source}"] = row["searches"]
    return figures


def warm_start(seed: int, out: Path, url: str) -> Path:
    """The seed's warm-started policy (built once) and its test figures under ``rows["warm_start"]``."""
    policy = out / f"seed{seed}" / "warm_start"
    args = os.environ.get("DEMO_WARM_START_ARGS", "").split()
    stamp = policy / ".warm_start_args"  # as the launcher records them: none recorded = none given
    if (policy / "warm_start.json").exists() and (stamp.read_text().split() if stamp.exists() else []) != args:
        print(f"{policy} was warm-started with other arguments: warm-starting it again", flush=True)
        shutil.rmtree(policy)
    if not (policy / "warm_start.json").exists():
        run([sys.executable, "-m", "data_prep.tiny_policy", "--data", DEMO, "--out", str(policy),
             "--retriever-url", url, "--seed", str(seed), *args], out / f"seed{seed}" / "warm_start.log")
        if args:
            stamp.write_text(" ".join(args) + "\n")
    return policy


def train_and_evaluate(name: str, seed: int, policy: Path, out: Path, url: str) -> dict[str, dict]:
    """One RL variant from the seed's warm start; returns {row name: figures} (PPO: also search off)."""
    run_dir = out / f"seed{seed}" / name
    model = run_dir / "hf_model"
    if not (model / "config.json").exists():
        run([sys.executable, "-m", "verl.trainer.main_ppo", "--config", "configs/demo.yaml", *VARIANTS[name][1],
             f"actor_rollout_ref.model.path={policy}", f"retriever.url={url}", f"trainer.seed={seed + 1}",
             f"data.seed={seed + 1}", f"trainer.default_local_dir={run_dir}",
             f"trainer.experiment_name=ablation_{name}", "trainer.val_before_train=false",
             f"trainer.test_freq={VAL_FREQ}",
             "trainer.logger=[jsonl]"],
            run_dir.with_suffix(".log"))
    rows = {name: {**evaluate(model, run_dir / "eval", url, seed), **curve(run_dir)}}
    if name == "ppo":
        rows["ppo_nosearch"] = evaluate(model, run_dir / "eval_nosearch", url, seed, ["do_search=false"])
    return rows


def curve(run_dir: Path) -> dict:
    """The run's in-training validation EM per step ({"curve": {step: val/em}}, empty without validation) and its
    mean generation rounds per step (``train/gen_rounds``: more than 1 with dynamic sampling, so more rollouts)."""
    points, rounds = {}, []
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        record = json.loads(line)
        if "val/em" in record:
            points[str(record["step"])] = record["val/em"]
        rounds.append(record.get("train/gen_rounds", 1.0))
    return {"curve": points, "gen_rounds": statistics.mean(rounds) if rounds else float("nan")}


def steps_to_reach(per_seed: dict[int, dict[str, dict]], name: str, target: float) -> str:
    """Per seed, the first validation step whose EM reaches ``target`` ("never" / "-" without a curve)."""
    cells = []
    for rows in per_seed.values():
        points = rows[name].get("curve") or {}
        hit = [int(step) for step, em in points.items() if em >= target]
        cells.append(str(min(hit)) if hit else ("never" if points else "-"))
    return " / ".join(cells)


def mean_std(values: list[float]) -> str:
    if any(v != v for v in values):  # NaN: not measured for this row (a warm start has no generation rounds)
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} +/- {statistics.stdev(values):.3f}"


def table(per_seed: dict[int, dict[str, dict]]) -> str:
    """Markdown table: one row per variant, mean +/- std over seeds of each column."""
    labels = {"warm_start": "warm start only (before RL)", "ppo_nosearch": "PPO, search off at test time",
              **{name: label for name, (label, _) in VARIANTS.items()}}
    names = [n for n in labels if all(n in rows for rows in per_seed.values())]
    target = statistics.mean(rows["ppo"]["em"] for rows in per_seed.values()) if "ppo" in names else None
    reach = f"steps to {target:.3f} (PPO's final EM), per seed" if target is not None else "steps to PPO's EM"
    lines = ["| " + " | ".join(["variant", *(c for _, c in COLUMNS), reach]) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for name in names:
        cells = [mean_std([per_seed[s][name].get(key, float("nan")) for s in per_seed]) for key, _ in COLUMNS]
        steps = steps_to_reach(per_seed, name, target) if target is not None and name in VARIANTS else "-"
        lines.append(f"| {labels[name]} | " + " | ".join(cells) + f" | {steps} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("outputs/ablations"))
    parser.add_argument("--retriever-url", default="http://127.0.0.1:8000")
    args = parser.parse_args(argv)
    out = args.out if args.out.is_absolute() else ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    check_source(out)
    if not (ROOT / DEMO / "test.parquet").exists():
        run([sys.executable, "-m", "data_prep.demo_kb", "--out", DEMO], out / "demo_kb.log")
    start = time.time()
    per_seed: dict[int, dict[str, dict]] = {seed: {} for seed in args.seeds}
    save = lambda: (out / "ablations.json").write_text(json.dumps(per_seed, indent=1))  # noqa: E731
    with retrieval_service(args.retriever_url, out / "retrieval.log"):
        policies = {}
        for seed in args.seeds:  # every warm start first, then variant by variant over the seeds
            policies[seed] = warm_start(seed, out, args.retriever_url)
            per_seed[seed]["warm_start"] = evaluate(policies[seed], out / f"seed{seed}" / "eval_warm_start",
                                                    args.retriever_url, seed)
            save()
        for name in args.variants:
            for seed in args.seeds:
                per_seed[seed].update(train_and_evaluate(name, seed, policies[seed], out, args.retriever_url))
                save()
    md = table(per_seed)
    header = (f"Test set of the demo (200 questions: 100 one-hop, 100 two-hop), greedy; mean +/- std over seeds "
              f"{', '.join(map(str, args.seeds))} of the whole pipeline (warm start + RL).")
    (out / "ablations.md").write_text(header + "\n\n" + md + "\n")
    print(header)
    print(md)
    print(f"[ablations] {time.time() - start:.0f} s; figures in {out / 'ablations.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
