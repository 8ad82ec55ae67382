"""Evaluate a policy on QA parquet files with the training agent loop; EM / sub-EM / F1 per data_source.

    python -m search_r1.evaluate --model DIR --data test.parquet [more.parquet ...] \\
        --retriever-url http://127.0.0.1:8000 [--mode agent|direct|rag] [--n K --temperature 1.0] [--limit N] \\
        --out DIR [key=value ...]

Runs exactly the loop of training and validation (``search_agent``: the agent loop over the engine that
``verl.workers.rollout.build_rollout`` builds from the config; prompts templated and length-filtered by
the trainer's ``PromptDataset``). Settings come from ``configs/ppo_trainer.yaml`` plus the trailing
``key=value`` overrides, e.g. ``max_turns=4 retriever.topk=5 reward.normalize=unicode``.
``--out`` receives ``trajectories.jsonl`` (one scored trajectory per line, in the trainer's trajectory record
format plus the evaluation's own fields: ``verl.utils.rollout_log``), ``results.json``,
``results.md`` and ``results.png`` (``search_r1.eval_report``), and ``run.json`` (the settings).

Choices:

- ``--mode``: ``agent`` (default) as trained; ``direct`` and ``rag``, the paper's baselines (``search_r1.baselines``:
  their own prompts, search disabled with ``max_turns=0``), through this same loop, scoring and reports.
- Greedy by default. ``--n K`` samples K trajectories per question at ``--temperature`` (default 1.0
  then) and adds pass@K; rows are repeated, as the trainer does for n samples.
- Scores: the answer is the last ``<answer>`` block of the response (``qa_em.extract_answer``);
  EM, sub-EM and F1 under ``reward.normalize`` (default ``squad``, the published recipe). Beside them each report
  gives searches, retrieval recall, turns, response tokens and the error classes with 95% intervals, on all
  questions and on those flagged ``extra_info.answer_bearing`` (``search_r1.eval_report``); a record keeps its
  flag (``answer_bearing``) and the passages its prompt held (``prompt_passages``: RAG's, else empty).
- Resumable: trajectories are appended in batches of ``--batch-size`` and flushed; a rerun with the
  same ``--out`` skips every (row, sample) already written, drops a torn last line, and refuses to
  mix runs whose settings (``run.json``) differ. ``--limit N`` evaluates the first N rows only; the
  report covers the rows of the current invocation. Greedy results do not depend on where a run was
  cut; sampled ones are reproducible for a given cut (seeds follow the batch's first item).
- Exit status 2 with ``error: <message>`` (naming the file or value and what is allowed) for every bad input
  found before the roll out: arguments and config keys, the model directory (its JSON files, tokenizer and
  weights are checked before loading), the parquet files (columns and rows, as the trainer checks them),
  ``--out`` (a directory, created if needed) and a retrieval service that does not answer; 1 for a retrieval
  failure during the roll out (rerun the same command to continue).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

from search_r1.baselines import MODES, SEARCH_DISABLED, SearchFn, baseline_messages
from search_r1.config import SearchConfig
from search_r1.eval_report import to_markdown, write_reports
from search_r1.llm_agent.generation import AgentLoop, SearchTrajectory, search_agent
from search_r1.reward.qa_em import em_check, extract_answer, f1_score, ground_truth_answers, subem_check
from search_r1.search.client import RetrievalClient, RetrievalError
from verl.config import ConfigError, load_config
from verl.utils.dataset import DataError
from verl.utils.progress import progress
from verl.utils.rollout_log import segments
from verl.workers.rollout.base import SamplingParams

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
TRAJECTORIES = "trajectories.jsonl"
RUN_SETTINGS = "run.json"


class EvalInputError(ValueError):
    """A bad input of the evaluation (model dir, data file, out dir); the message names it."""


def agent_config(model: str, engine: str, retriever_url: str, seed: int, overrides: Sequence[str] = (),
                 files: Sequence[str] = ()) -> SearchConfig:
    """The training config for evaluating ``model``: the YAML defaults, the ``files`` layered on them (e.g.
    configs/demo.yaml), these settings, then ``overrides``."""
    return load_config([f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.rollout.name={engine}",
                        f"retriever.url={retriever_url}", f"trainer.seed={seed}", *overrides], list(files))


def build_agent(cfg: SearchConfig, tokenizer) -> AgentLoop:
    """The training loop over this process's engine and the retrieval service (health-checked first: EvalInputError
    if it does not answer)."""
    from verl.workers.model_files import check_positions
    from verl.workers.rollout import build_rollout  # heavy import (torch, transformers), once inputs are checked

    try:
        check_positions(cfg)
    except ConfigError as err:
        raise EvalInputError(str(err)) from None

    return search_agent(cfg, tokenizer, build_rollout(cfg), retrieval_client(cfg) if cfg.retrieves else None)


def retrieval_client(cfg: SearchConfig) -> RetrievalClient:
    """The client of ``retriever.url``, health-checked (EvalInputError if the service does not answer)."""
    if cfg.retriever.url is None:
        raise EvalInputError("no retrieval service: give --retriever-url")
    client = RetrievalClient.from_config(cfg.retriever, cfg.trainer.ray_timeout_s)
    try:
        client.check_health()
    except RetrievalError as err:  # a wrong or unstarted retriever URL: an input error
        raise EvalInputError(str(err)) from None
    return client


def score_trajectory(tokenizer, traj: SearchTrajectory, golden: list[str], normalize: str) -> dict:
    """The response text, answer, scores and loop counters of one trajectory (a trajectories.jsonl record)."""
    response = tokenizer.decode(traj.response_ids, skip_special_tokens=True)
    answer = extract_answer(response)
    scores = {name: 0.0 if answer is None else fn(answer, golden, normalize)
              for name, fn in (("em", em_check), ("subem", subem_check), ("f1", f1_score))}
    return {"golden": golden, "answer": answer, **scores, "searches": traj.num_searches, "turns": traj.num_turns,
            "invalid": traj.num_invalid, "tool_calls": traj.num_tool_calls, "invalid_calls": traj.num_invalid_calls,
            "stop_reason": traj.stop_reason.value,
            "response_tokens": len(traj.response_ids),
            "inserted_tokens": len(traj.info_mask) - sum(traj.info_mask), "response": response}


def trajectory_fields(tokenizer, traj: SearchTrajectory, record: dict, prompt_ids: list[int]) -> dict:
    """The fields of the trainer's trajectory record (``verl.utils.rollout_log``, the viewer's format) that a
    ``score_trajectory`` record (with its ``row`` and ``sample``) lacks: no step, split ``test``, the EM as the score
    and EM / sub-EM / F1 as the reward terms, no advantage."""
    group = f"row{record['row']}"
    return {"step": None, "split": "test", "uid": f"{group}-{record['sample']}", "group": group,
            "index": record["row"], "input": tokenizer.decode(prompt_ids, skip_special_tokens=False),
            "output": record["response"], "segments": segments(traj.response_ids, traj.info_mask, tokenizer),
            "queries": list(traj.queries), "ground_truth": record["golden"], "score": record["em"],
            "reward_terms": {name: record[name] for name in ("em", "subem", "f1")}, "advantage": None,
            "num_searches": traj.num_searches, "response_length": len(traj.response_ids), "min_version": None,
            "max_version": None}


def check_model_dir(model: str) -> None:
    """A Hugging Face model directory whose config, tokenizer and weights files load (checked without loading)."""
    from verl.workers.model_files import check_model_files  # transformers, when it checks

    path = Path(model)
    if not path.is_dir():
        raise EvalInputError(f"--model {model}: " + ("a file, not" if path.exists() else "no such") + " directory "
                             "(allowed: a Hugging Face model directory with config.json, tokenizer and weights)")
    if not (path / "config.json").exists():
        raise EvalInputError(f"--model {model}: no config.json (not a Hugging Face model directory)")
    try:
        check_model_files(model)
    except ValueError as err:
        raise EvalInputError(f"--model {model}: {err}") from None


def make_out_dir(out: Path) -> None:
    """``--out`` is a directory (created with its parents if missing)."""
    if out.exists() and not out.is_dir():
        raise EvalInputError(f"--out {out} is a file; name a directory (created if missing, reused to resume)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EvalInputError(f"--out {out}: cannot create the directory ({err.strerror}: {err.filename})") from None


def check_data_files(files: Sequence[str]) -> None:
    """Every file exists and has the Search-R1 columns."""
    for name in files:
        if not Path(name).is_file():
            raise EvalInputError(f"--data {name}: no such file")
        try:
            columns = pq.read_schema(name).names
        except Exception as err:  # pyarrow raises several types for a file that is not parquet
            raise EvalInputError(f"--data {name}: not a parquet file ({err})") from err
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise EvalInputError(f"--data {name}: missing column(s) {', '.join(missing)}; has {', '.join(columns)} "
                                 f"(needs {', '.join(REQUIRED_COLUMNS)}: the Search-R1 schema, data_prep.qa_search)")


def read_done(path: Path) -> list[dict]:
    """Records already in ``path``; a torn last line (no newline: the run was killed mid-write) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    if complete < len(data):
        logger.warning("dropping a torn last line of %s (%d bytes)", path, len(data) - complete)
        with path.open("r+b") as f:
            f.truncate(complete)
    records = []
    for line_no, line in enumerate(data[:complete].decode().splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise EvalInputError(f"{path}:{line_no} is not valid JSON ({err.msg}); "
                                 "move the file away to restart") from err
    return records


def check_run_settings(out: Path, settings: dict) -> None:
    """Write ``run.json``, or check that the one already in ``out`` has the same settings."""
    path = out / RUN_SETTINGS
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError as err:
            raise EvalInputError(f"{path} is not valid JSON ({err}); move it away (with {TRAJECTORIES}) to start "
                                 "over") from None
        changed = sorted(k for k in old.keys() | settings.keys() if old.get(k) != settings.get(k))
        if changed:
            diff = "; ".join(f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in changed)
            raise EvalInputError(f"--out {out} holds a run with other settings ({diff}); use another --out "
                                 "or the same settings to resume")
    else:
        path.write_text(json.dumps(settings, indent=2) + "\n")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m search_r1.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory (weights + tokenizer)")
    p.add_argument("--data", required=True, nargs="+", help="parquet file(s) in the Search-R1 schema")
    p.add_argument("--retriever-url", default="http://127.0.0.1:8000", help="base URL of the retrieval service")
    p.add_argument("--out", required=True, type=Path, help="output directory (created; reused to resume)")
    p.add_argument("--mode", choices=MODES, default="agent",
                   help="agent: as trained (default); direct: answer without retrieval; rag: the top-k passages "
                   "retrieved with the question in the prompt, no further search (search_r1.baselines)")
    p.add_argument("--n", type=int, default=1, help="trajectories per question (pass@n when > 1)")
    p.add_argument("--temperature", type=float, default=None, help="default 0 (greedy) with --n 1, else 1.0")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N rows only")
    p.add_argument("--batch-size", type=int, default=64, help="trajectories per loop call and per write")
    p.add_argument("--ray-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="--retriever-url ray://NAME: give up joining the Ray cluster after this many seconds")
    p.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="YAML layered over configs/ppo_trainer.yaml, as in training (e.g. configs/demo.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (configs/ppo_trainer.yaml)")
    args = p.parse_args(argv)
    if args.temperature is None:
        args.temperature = 0.0 if args.n == 1 else 1.0
    if not 0 <= args.temperature <= 10:  # also refuses nan and inf
        p.error(f"--temperature must be in [0, 10] (0 = greedy), got {args.temperature}")
    if not 0 < args.ray_timeout < float("inf"):
        p.error(f"--ray-timeout must be a positive number of seconds, got {args.ray_timeout}")
    for name in ("n", "batch_size", "limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.n > 1 and args.temperature == 0:
        p.error("--n > 1 needs --temperature > 0 (greedy samples would all be equal)")
    return args


def evaluate(args: argparse.Namespace) -> dict:
    """Check the inputs, roll out every (row, sample) not yet written, write the reports; returns the results."""
    check_model_dir(args.model)
    check_data_files(args.data)
    for f in args.config:
        if not Path(f).is_file():
            raise EvalInputError(f"--config {f!r}: no such file (a YAML of keys layered over configs/ppo_trainer.yaml)")
    baseline = [SEARCH_DISABLED] if args.mode != "agent" else []  # last: a baseline never searches
    cfg = agent_config(args.model, args.engine, args.retriever_url, args.seed,
                       [f"trainer.ray_timeout_s={args.ray_timeout}", *args.overrides, *baseline], args.config)
    if baseline and cfg.search_turns != 0:
        raise EvalInputError(f"--mode {args.mode} disables search (max_turns=0), but "
                             "actor_rollout_ref.rollout.multi_turn.max_assistant_turns="
                             f"{cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns} allows "
                             f"{cfg.search_turns}; leave it null (or 1) with a baseline mode")
    make_out_dir(args.out)
    check_run_settings(args.out, {
        "model": str(Path(args.model).resolve()), "data": [str(Path(d).resolve()) for d in args.data],
        "n": args.n, "temperature": args.temperature, "seed": args.seed, "engine": args.engine,
        "overrides": list(args.overrides), **({"config": list(args.config)} if args.config else {}),
        **({"mode": args.mode} if args.mode != "agent" else {})})
    from transformers import AutoTokenizer

    from verl.tools import run_tool_specs
    from verl.utils.dataset import PromptDataset

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tools = [spec.schema for spec in run_tool_specs(cfg) or []]  # shown in the prompts (the hermes format)
    dataset = PromptDataset(",".join(args.data), tokenizer, cfg.data.max_prompt_length, cfg.data.prompt_key,
                            args.limit, tools=tools)
    items = [(row, sample) for row in range(len(dataset)) for sample in range(args.n)]
    path = args.out / TRAJECTORIES
    done = {(r["row"], r["sample"]): r for r in read_done(path)}
    todo = [item for item in items if item not in done]
    if todo:
        rag_client = retrieval_client(cfg) if args.mode == "rag" else None  # RAG's retrieval, before each batch
        try:
            agent = build_agent(cfg, tokenizer)
            prompts = BatchPrompts(args.mode, dataset, tokenizer, tools, cfg,
                                   rag_client.search if rag_client else None)
            _roll_out(agent, tokenizer, dataset, prompts, todo, args, cfg.reward.normalize, path,
                      done_before=len(items) - len(todo))
        finally:
            if rag_client is not None:
                rag_client.close()
        done.update({(r["row"], r["sample"]): r for r in read_done(path)})
    records = [done[item] for item in items]
    title = f"{Path(args.model).name} on {', '.join(Path(d).name for d in args.data)}" + \
        (f" ({args.mode})" if args.mode != "agent" else "")
    return write_reports(records, args.out, title, cfg.reward.normalize)


class BatchPrompts:
    """The prompts one evaluation batch's rows are rolled out from: the dataset's (``--mode agent``), or a baseline's
    (``search_r1.baselines``: RAG retrieves here, once per batch, before the batch generates)."""

    def __init__(self, mode: str, dataset, tokenizer, tools: list[dict], cfg: SearchConfig,
                 search: SearchFn | None) -> None:
        self.mode, self.dataset, self.tokenizer, self.search = mode, dataset, tokenizer, search
        self.tools = tools if mode == "agent" else None  # a baseline offers no tool
        self.max_prompt_length = cfg.data.max_prompt_length
        self.max_start_length = cfg.data.max_start_length

    def __call__(self, rows: list[int]) -> tuple[list[list[int]], list[str], list[str]]:
        """Prompt ids, user message and passages in the prompt (RAG's; ``""`` otherwise) of each of ``rows``."""
        from verl.utils.tokenizer import render_prompt

        sources = [self.dataset.rows[row] for row in rows]
        if self.mode == "agent":
            return ([self.dataset.prompt_ids[row] for row in rows], [s["prompt"][-1]["content"] for s in sources],
                    [""] * len(rows))
        try:
            messages, passages = baseline_messages(self.mode, sources, [f"--data row {row}" for row in rows],
                                                   self.search)
        except ValueError as err:
            raise EvalInputError(str(err)) from None
        ids = [list(render_prompt(self.tokenizer, m, self.tools)) for m in messages]
        limit = min(self.max_prompt_length, self.max_start_length)
        for row, prompt in zip(rows, ids, strict=True):
            if len(prompt) > limit:
                raise EvalInputError(f"--mode {self.mode}: the prompt of row {row} has {len(prompt)} tokens, over "
                                     f"data.max_start_length={self.max_start_length} or data.max_prompt_length="
                                     f"{self.max_prompt_length}; raise both (a cut prompt would lose its "
                                     "instruction)")
        return ids, [m[-1]["content"] for m in messages], passages


def _roll_out(agent: AgentLoop, tokenizer, dataset, prompts: BatchPrompts, todo: list[tuple[int, int]],
              args: argparse.Namespace, normalize: str, path: Path, done_before: int) -> None:
    """Run the loop over ``todo`` in batches, appending each batch's scored records to ``path`` (flushed)."""
    with path.open("a") as f, progress(total=done_before + len(todo), initial=done_before, unit="traj",
                                   desc="evaluate") as bar:
        for start in range(0, len(todo), args.batch_size):
            batch = todo[start:start + args.batch_size]
            first_row, first_sample = batch[0]
            params = SamplingParams(max_tokens=agent.data.max_response_length, temperature=args.temperature,
                                    seed=args.seed + first_row * args.n + first_sample)
            prompt_ids, messages, passages = prompts([row for row, _ in batch])
            result = agent.run(prompt_ids, params)
            lines = []
            for i, ((row, sample), traj) in enumerate(zip(batch, result.trajectories, strict=True)):
                source = dataset.rows[row]
                golden = ground_truth_answers(source["reward_model"]["ground_truth"])
                record = {"row": row, "sample": sample, "data_source": source["data_source"],
                          "prompt": messages[i], "prompt_passages": passages[i],
                          "answer_bearing": (source.get("extra_info") or {}).get("answer_bearing"),
                          **score_trajectory(tokenizer, traj, golden, normalize)}
                record.update(trajectory_fields(tokenizer, traj, record, prompt_ids[i]))
                lines.append(json.dumps(record, ensure_ascii=False) + "\n")
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(batch))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        results = evaluate(args)
    except (EvalInputError, ConfigError, DataError, RetrievalError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1 if isinstance(err, RetrievalError) else 2
    print(to_markdown(results, f"results in {args.out}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
