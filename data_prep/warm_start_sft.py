"""The demo's warm start through the supervised cold-start path: the tiny policy's scripted trajectories as SFT rows,
trained by ``verl.trainer.main_sft``, the stage every user's model takes before RL (``data_prep/tiny_policy.py``
scripts the trajectories, builds the tokenizer and the model and runs the copy task first).

- The rows are text (``turns``), tokenised by ``verl.utils.sft_dataset`` as RL tokenises them; a passage block that
  the loop would cut to ``data.max_obs_length`` is written as the decoded cut block, so the rows hold what RL shows
  (``tiny_policy.encode_trajectory``'s tokens, a test checks). A policy turn ends at its stop string (the loop never
  samples past ``</answer>``).
- No copy rows: the copy task before (``tiny_policy.pretrain_copy``, run to a low loss) forms the copying skill, and
  rows whose answer repeats the user's words broke the closing tags (half the spans closed with the other tag, PPO
  then learnt nothing; docs/results.md, "The demo's warm start through main_sft").
- AdamW with betas (0.9, 0.98) and weight decay 0.01, a linear warm-up then a cosine to 10 %, clipping at 1; steps of
  similar-length rows up to a padded-token budget with every policy token weighted the same
  (``data.train_batch_tokens``). ``cfg.tokens_per_batch`` counts the tokens after the instruction every row shares
  (the budget the warm start was tuned with, when it ran the instruction once per step); the budget given to
  ``main_sft``, which counts whole rows, is it scaled by the rows' whole length over their length after the
  instruction.
- The run (rows, the model after the copy task, the SFT run directory) is kept in ``<policy>/warm_start``; a rerun of
  a killed warm start resumes the SFT run from its last checkpoint (every 500 steps).
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from pathlib import Path

from data_prep.cold_start import sft_row
from data_prep.qa_search import make_row
from data_prep.sft_rows import rows_to_sft_parquet
from search_r1.llm_agent.formatting import information_block, observation_ids, policy_turn

COPY_SOURCE = "copy_task"


def trajectory_turns(tokenizer, segments: Sequence, max_obs_length: int) -> list[dict]:
    """SFT turns of a scripted trajectory's segments (``tiny_policy.Segment``): policy text trained, passage blocks
    context, each block as the agent loop inserts it (cut to ``max_obs_length`` tokens when longer)."""
    turns = []
    for seg in segments:
        if seg.docs is None:
            turns.append(policy_turn(seg.text))
            continue
        ((ids, cut),) = observation_ids(tokenizer, [seg.docs], max_obs_length)
        turns.append({"text": tokenizer.decode(ids) if cut else information_block(seg.docs), "sampled": False})
    return turns


def copy_rows(trajs: Sequence, words: Sequence[str], count: int, max_words: int, rng: random.Random) -> list[dict]:
    """``count`` copy rows in the loop's layout: a training question's prompt, then a sequence of 2 to ``max_words``
    random corpus words as context (masked, as an inserted block is), then the same sequence, trained (the same
    ids: each turn is tokenised on its own). Copying out of inserted context, the skill the copy task formed, with
    nothing that the policy would learn to write on its own."""
    rows = []
    for k in range(count):
        question = rng.choice(trajs).question
        seq = " ".join(rng.choice(words) for _ in range(rng.randint(2, max(2, max_words))))
        rows.append(sft_row(make_row(COPY_SOURCE, question.question, question.answers, "train", k),
                            [{"text": seq, "sampled": False}, policy_turn(seq)]))
    return rows


def write_rows(trajs: Sequence, tokenizer, max_obs_length: int, path: Path, extra: Sequence[dict] = ()) -> Path:
    """The warm start's SFT parquet: one row per scripted trajectory, then the ``extra`` rows."""
    rows = [sft_row(make_row(t.question.data_source, t.question.question, t.question.answers, "train", k),
                    trajectory_turns(tokenizer, t.segments, max_obs_length)) for k, t in enumerate(trajs)]
    rows += list(extra)
    rows_to_sft_parquet(rows, path)
    return path


def train(pretrained: Path, rows: Path, run_dir: Path, steps: int, tokens_per_step: int, lr: float,
          warmup_ratio: float, seed: int) -> list[float]:
    """``main_sft`` on ``rows`` from the model directory ``pretrained`` into ``run_dir`` (resumed if it holds this run);
    returns the logged loss of each step (the token mean of the policy tokens)."""
    from verl.config_sft import load_sft_config
    from verl.trainer.sft_trainer import SFTTrainer
    from verl.utils.tracking import read_metrics

    cfg = load_sft_config([
        f"model.partial_pretrain={pretrained}", f"data.train_files={rows}",
        f"data.train_batch_tokens={tokens_per_step}", "data.micro_batch_size_per_gpu=100000", "data.max_length=100000",
        f"optim.lr={lr}", "optim.weight_decay=0.01",
        "optim.betas=[0.9,0.98]", f"optim.warmup_steps_ratio={warmup_ratio}", "optim.lr_scheduler=cosine",
        "optim.min_lr_ratio=0.1", "optim.clip_grad=1.0", f"trainer.total_training_steps={steps}",
        f"trainer.seed={seed}", "trainer.device=cpu", "trainer.logger=[jsonl]", "trainer.save_freq=500",
        "trainer.experiment_name=warm_start", f"trainer.default_local_dir={run_dir}"])
    trainer = SFTTrainer(cfg)
    trainer.fit()
    return [r["train/loss"] for r in read_metrics(trainer.tracker.jsonl_path)]


def install(run_dir: Path, out_dir: Path) -> None:
    """Copy the run's ``hf_model/`` (weights, config, generation config, tokenizer) into the policy directory."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in (run_dir / "hf_model").iterdir():
        shutil.copy2(item, out_dir / item.name)


def run(model, tokenizer, trajs: Sequence, lengths: Sequence[int], n_prefix: int, cfg, out_dir: Path) -> list[float]:
    """The trajectories as SFT rows through ``main_sft``, from ``model`` (the copy task already trained); the policy is
    written to ``out_dir``, its run kept in ``out_dir/warm_start``. ``lengths``: the token counts of ``trajs``
    (``tiny_policy.encode_trajectory``), ``n_prefix`` the instruction they share; ``cfg`` a
    ``tiny_policy.WarmStartConfig``. Returns the losses."""
    work = out_dir / "warm_start"
    model.save_pretrained(work / "pretrained")
    tokenizer.save_pretrained(work / "pretrained")
    after_prefix = [n - n_prefix for n in lengths]
    # cfg.tokens_per_batch counts the tokens after the shared instruction (as tuned); main_sft's budget, whole rows
    budget = round(cfg.tokens_per_batch * sum(lengths) / sum(after_prefix))
    words = sorted({w for t in trajs for seg in t.segments if seg.docs for d in seg.docs
                    for w in d["contents"].split() if w.isalpha()})
    rng = random.Random(cfg.seed)
    extra = copy_rows(trajs, words, cfg.copy_rows, cfg.copy_length // 3, rng) if cfg.copy_rows else []
    rows = write_rows(trajs, tokenizer, cfg.max_obs_length, work / "rows.parquet", extra)
    losses = train(work / "pretrained", rows, work / "sft", cfg.steps, budget, cfg.lr, cfg.warmup_ratio, cfg.seed)
    install(work / "sft", out_dir)
    return losses
