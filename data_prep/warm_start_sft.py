"""The demo's warm start through the supervised cold-start path: the tiny policy's scripted trajectories as SFT rows,
trained by ``verl.trainer.main_sft``, the stage every user's model takes before RL (``data_prep/tiny_policy.py``
scripts the trajectories, builds the tokenizer and the model and runs the copy task first).

- The rows are text (``turns``), tokenised by ``verl.utils.sft_dataset`` as RL tokenises them; a passage block that
  the loop would cut to ``data.max_obs_length`` is written as the decoded cut block, so the rows hold what RL shows
  (``tiny_policy.encode_trajectory``'s tokens, a test checks). A policy turn ends at its stop string (the loop never
  samples past ``</answer>``).
- The copying skill is kept by a second objective (``data.mix_files``): every step adds the loss of
  ``cfg.copy_rows`` text rows, each the instruction every trajectory starts with, then a sequence of random vocabulary
  tokens (decoded to text), then the same sequence, trained. That is the layout, weight and content of the copy rows
  the demo's former own training loop mixed into its steps: the copy sits where no policy turn is, inside the
  prompt, and weighs as much as the step's trajectories. Sequences of the passages' words instead
  (``--copy-source words``) gave test EM 0.580 / 0.745 / 0.740 on seeds 0-2, against 0.815 / 0.900 / 0.730: lower
  on two seeds, level on one. Copy rows as SFT rows (after the chat template's assistant header) taught the policy
  to write them: chat turns repeating the user's words broke the closing tags, copies of masked context made it loop
  ``<think>`` after a passage block; with no copy rows at all, the skill faded during SFT and the policy misread names
  (docs/results.md, "The demo's warm start through main_sft").
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

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep.cold_start import sft_row
from data_prep.qa_search import make_row
from data_prep.sft_rows import TURNS_TYPE, rows_to_sft_parquet
from data_prep.tiny_model import TAG_TOKENS
from search_r1.llm_agent.formatting import information_block, observation_ids, policy_turn


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


def copy_text_rows(tokenizer, prefix_ids: Sequence[int], pieces: Sequence[str], sep: str, count: int,
                   max_tokens: int, rng: random.Random) -> list[dict]:
    """``count`` copy rows as text rows (``verl.utils.sft_dataset.TextDataset``): the instruction ``prefix_ids``
    decoded, then a sequence of random ``pieces`` joined by ``sep``, of ``max_tokens // 3`` to ``max_tokens`` tokens
    (context), then the same sequence (trained; the same ids, each turn being tokenised on its own)."""
    prefix = tokenizer.decode(list(prefix_ids))
    rows = []
    for _ in range(count):
        target, seq = rng.randint(max(2, max_tokens // 3), max_tokens), ""
        while len(tokenizer(sep + seq, add_special_tokens=False)["input_ids"]) < target:
            seq = f"{seq}{sep}{rng.choice(pieces)}" if seq else rng.choice(pieces)
        rows.append({"turns": [{"text": prefix, "sampled": False}, {"text": sep + seq, "sampled": False},
                               {"text": sep + seq, "sampled": True}]})
    return rows


def copy_pieces(tokenizer, trajs: Sequence, source: str) -> tuple[list[str], str]:
    """What copy sequences are made of: ``tokens``, the vocabulary's tokens but the special ones and the tags, each
    decoded (the former own loop's random token ids), joined as they are; ``words``, the passages' words, joined by
    spaces."""
    if source not in ("tokens", "words"):
        raise ValueError(f"copy_source={source!r} is invalid (allowed: tokens, words)")
    if source == "words":
        return sorted({w for t in trajs for seg in t.segments if seg.docs for d in seg.docs
                       for w in d["contents"].split() if w.isalpha()}), " "
    special = set(tokenizer.all_special_ids) | set(tokenizer.convert_tokens_to_ids(TAG_TOKENS))
    return [tokenizer.decode([i]) for i in range(len(tokenizer)) if i not in special], ""


def write_text_rows(rows: Sequence[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows), schema=pa.schema([("turns", TURNS_TYPE)])), path)
    return path


def write_rows(trajs: Sequence, tokenizer, max_obs_length: int, path: Path) -> Path:
    """The warm start's SFT parquet: one row per scripted trajectory."""
    rows = [sft_row(make_row(t.question.data_source, t.question.question, t.question.answers, "train", k),
                    trajectory_turns(tokenizer, t.segments, max_obs_length)) for k, t in enumerate(trajs)]
    rows_to_sft_parquet(rows, path)
    return path


def train(pretrained: Path, rows: Path, run_dir: Path, steps: int, tokens_per_step: int, lr: float,
          warmup_ratio: float, seed: int, mix: Path | None = None, mix_rows: int = 8) -> list[float]:
    """``main_sft`` on ``rows`` (and ``mix_rows`` text rows of ``mix`` a step) from the model directory ``pretrained``
    into ``run_dir`` (resumed if it holds this run); returns the logged loss of each step (the token mean of the policy
    tokens)."""
    from verl.config import load_sft_config
    from verl.trainer.sft_trainer import SFTTrainer
    from verl.utils.tracking import read_metrics

    cfg = load_sft_config([
        f"model.partial_pretrain={pretrained}", f"data.train_files={rows}",
        f"data.train_batch_tokens={tokens_per_step}", "data.micro_batch_size_per_gpu=100000", "data.max_length=100000",
        f"optim.lr={lr}", "optim.weight_decay=0.01",
        "optim.betas=[0.9,0.98]", f"optim.warmup_steps_ratio={warmup_ratio}", "optim.lr_scheduler=cosine",
        "optim.min_lr_ratio=0.1", "optim.clip_grad=1.0", f"trainer.total_training_steps={steps}",
        f"trainer.seed={seed}", "trainer.device=cpu", "trainer.logger=[jsonl]", "trainer.save_freq=500",
        "trainer.experiment_name=warm_start", f"trainer.default_local_dir={run_dir}"]
        + ([f"data.mix_files={mix}", f"data.mix_rows_per_step={mix_rows}"] if mix else []))
    trainer = SFTTrainer(cfg)
    trainer.fit()
    return [r["train/loss"] for r in read_metrics(trainer.tracker.jsonl_path)]


def install(run_dir: Path, out_dir: Path) -> None:
    """Copy the run's ``hf_model/`` (weights, config, generation config, tokenizer) into the policy directory."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in (run_dir / "hf_model").iterdir():
        shutil.copy2(item, out_dir / item.name)


def run(model, tokenizer, trajs: Sequence, lengths: Sequence[int], prefix_ids: Sequence[int], cfg,
        out_dir: Path) -> list[float]:
    """The trajectories as SFT rows through ``main_sft``, with ``cfg.copy_rows`` copy rows a step mixed in, from
    ``model`` (the copy task already trained); the policy is written to ``out_dir``, its run kept in
    ``out_dir/warm_start``. ``lengths``: the token counts of ``trajs`` (``tiny_policy.encode_trajectory``),
    ``prefix_ids`` the instruction they share; ``cfg`` a ``tiny_policy.WarmStartConfig``. Returns the losses."""
    work = out_dir / "warm_start"
    model.save_pretrained(work / "pretrained")
    tokenizer.save_pretrained(work / "pretrained")
    after_prefix = [n - len(prefix_ids) for n in lengths]
    # cfg.tokens_per_batch counts the tokens after the shared instruction (as tuned); main_sft's budget, whole rows
    budget = round(cfg.tokens_per_batch * sum(lengths) / sum(after_prefix))
    rows = write_rows(trajs, tokenizer, cfg.max_obs_length, work / "rows.parquet")
    mix = None
    if cfg.copy_rows:  # one fresh sequence per row and step, as the former own loop drew them
        pieces, sep = copy_pieces(tokenizer, trajs, cfg.copy_source)
        mix = write_text_rows(copy_text_rows(tokenizer, prefix_ids, pieces, sep, cfg.copy_rows * cfg.steps,
                                             cfg.copy_length, random.Random(cfg.seed)), work / "copy_rows.parquet")
    losses = train(work / "pretrained", rows, work / "sft", cfg.steps, budget, cfg.lr, cfg.warmup_ratio, cfg.seed,
                   mix, max(1, cfg.copy_rows))
    install(work / "sft", out_dir)
    return losses
