"""The supervised cold start (``verl.trainer.main_sft``) on a tiny model: it learns the loop's tags, resumes exactly,
trains LoRA adapters, groups rows into token-budget steps, and refuses bad input with a message naming it.
In-process (``main(argv)``), no services."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_prep.qa_search import make_row, rows_to_parquet
from search_r1.prompts import make_prompt
from tests.entry_points import in_process
from tests.verl.trainer.sft_test_utils import TEMPLATE, question, scripted_rows, tiny_sft_model, write_rows
from verl.config import load_sft_config
from verl.trainer.sft_trainer import SFTTrainer
from verl.utils import checkpoint
from verl.utils.sft_dataset import TokenBudgetLoader, TrajectoryDataset
from verl.workers.model_utils import response_log_probs
from verl.workers.train_utils import GlobalCounts

ROOT = Path(__file__).resolve().parents[3]

# one thread: a tiny model's step took 0.06-0.1 s with one, 1-4 s with two on the shared, loaded 2-core machine
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A tiny random model, 32 scripted training trajectories and 4 held-out ones."""
    root = tmp_path_factory.mktemp("sft")
    tiny_sft_model(root)
    write_rows(scripted_rows(range(32)), root / "train.parquet")
    write_rows(scripted_rows(range(32, 36)), root / "val.parquet")
    return root


def args(root: Path, out: Path, *extra: str) -> list[str]:
    return [f"model.partial_pretrain={root / 'model'}", f"data.train_files={root / 'train.parquet'}",
            f"trainer.default_local_dir={out}", "data.train_batch_size=8", "data.micro_batch_size_per_gpu=4",
            "trainer.logger=[jsonl]", "trainer.device=cpu", *extra]


def main(argv: list[str]) -> int:
    """``python -m verl.trainer.main_sft argv`` in this process (``tests/entry_points.py``); its exit status, its
    stderr echoed to this test's (pytest shows it on failure)."""
    done = in_process("verl.trainer.main_sft", *argv)
    sys.stderr.write(done.stderr)
    return done.returncode


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def greedy(model_dir: Path, text: str, tokens: int) -> str:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False)
    return tokenizer.decode(out[0, len(ids):])


def test_a_short_sft_teaches_a_tiny_model_to_start_a_search(workspace, tmp_path):
    """Guards against an SFT that trains on the wrong tokens (the prompt or the inserted blocks, an off-by-one
    between logits and labels) or does not train at all: after 24 steps the greedy policy, on a question it never
    saw, opens with the scripted search turn; the random model it started from does not."""
    held_out = make_prompt(question(90), TEMPLATE)
    assert "<search>" not in greedy(workspace / "model", held_out, 12)
    out = tmp_path / "run"
    assert main(args(workspace, out, f"data.val_files={workspace / 'val.parquet'}", "optim.lr=3e-3",
                     "trainer.total_training_steps=24")) == 0
    text = greedy(out / "hf_model", held_out, 12)
    assert text.startswith("<think> I need to search. </think><search>"), text
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["val/loss"] < 1.5 and record["train/loss"] < losses(out)[1] / 3, record
    assert (out / "curves.png").is_file()


def test_a_rerun_resumes_from_the_last_checkpoint_exactly(workspace, tmp_path):
    """Guards against a resume that restarts the data order, the optimiser or the LR schedule (warm-up, then verl's
    cosine with its betas, each step's LR checked): a 4-step run whose
    last checkpoint and model are lost (a kill during the last save) is rerun; it continues from step 2 and ends
    with the same losses and weights; a rerun of the finished run trains nothing (and writes hf_model/ if a kill
    lost it)."""
    out = tmp_path / "run"
    argv = args(workspace, out, "trainer.save_freq=2", "optim.lr=1e-3", "optim.warmup_steps_ratio=0.25",
                "optim.lr_scheduler=cosine", "optim.min_lr_ratio=0.1", "optim.betas=[0.9,0.95]",
                "trainer.total_training_steps=4")
    assert main(argv) == 0
    first, weights = losses(out), load_file(out / "hf_model" / "model.safetensors")
    lrs = [r["train/lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    assert lrs == pytest.approx([1e-3, 1e-3, 1e-3 * (0.1 + 0.9 * 0.75), 1e-3 * (0.1 + 0.9 * 0.25)])  # verl's keys
    shutil.rmtree(out / "global_step_4")
    shutil.rmtree(out / "hf_model")
    assert main(argv) == 0
    assert losses(out) == pytest.approx(first, rel=1e-6) and sorted(losses(out)) == [1, 2, 3, 4]
    again = load_file(out / "hf_model" / "model.safetensors")
    for name in weights:
        torch.testing.assert_close(again[name], weights[name], rtol=1e-6, atol=1e-7)
    shutil.rmtree(out / "hf_model")  # a kill between the last checkpoint and the export: the rerun exports only
    assert main(argv) == 0
    assert (out / "metrics.jsonl").read_text().count("\n") == 4
    assert load_file(out / "hf_model" / "model.safetensors").keys() == weights.keys()


def test_a_run_keeping_one_checkpoint_deletes_the_older_and_still_resumes(workspace, tmp_path):
    """Guards against trainer.max_ckpt_to_keep (verl's SFT key) being ignored, deleting the checkpoint a rerun
    needs, or counting the export: a 3-step run saving every step keeps only step 3 (and hf_model/); the same run
    extended to 5 steps resumes from it and again leaves only its last."""
    out = tmp_path / "run"
    keep = ["trainer.save_freq=1", "trainer.max_ckpt_to_keep=1"]
    assert main(args(workspace, out, *keep, "trainer.total_training_steps=3")) == 0
    assert checkpoint.complete_steps(out) == [3] and (out / "hf_model").is_dir()
    shutil.rmtree(out / "hf_model")
    assert main(args(workspace, out, *keep, "trainer.total_training_steps=5")) == 0
    assert checkpoint.complete_steps(out) == [5] and sorted(losses(out)) == [1, 2, 3, 4, 5]
    assert not list(out.glob("*.tmp"))


def test_lora_trains_only_the_adapters_and_exports_merged_weights(workspace, tmp_path):
    """Guards against LoRA that trains (or checkpoints) the base weights, or an export that drops the adapters: only
    the adapted projections of hf_model/ differ from the base model, the checkpoint holds adapters only, and the
    loss falls."""
    out = tmp_path / "lora"
    assert main(args(workspace, out, "model.lora_rank=8", "model.lora_alpha=16", "model.target_modules=[q_proj,v_proj]",
                     "optim.lr=1e-2", "trainer.total_training_steps=6", "trainer.save_freq=6")) == 0
    base = load_file(workspace / "model" / "model.safetensors")
    tuned = load_file(out / "hf_model" / "model.safetensors")
    assert tuned.keys() == base.keys()
    changed = {name for name in base if not torch.equal(base[name], tuned[name])}
    assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed), changed
    shards = sum(f.stat().st_size for f in (out / "global_step_6" / "model").glob("*.distcp"))
    assert shards < sum(t.numel() * 4 for t in base.values()) / 4  # adapters and their Adam moments only
    steps = losses(out)
    assert steps[6] < steps[1]


def mixed_length_rows(n: int) -> list[dict]:
    """Trajectories of three lengths, like the demo's scripted agent: an answer at once, one search, two searches."""
    rows = scripted_rows(range(n))
    for k, row in enumerate(rows):
        if k % 3 == 0:  # a guess: the answer turn alone
            row["turns"] = row["turns"][-1:]
        elif k % 3 == 2:  # a second search before the answer
            row["turns"] = row["turns"][:2] + row["turns"][:2] + row["turns"][2:]
    return rows


def test_token_budget_steps_group_by_length_and_resume_exactly(workspace, tmp_path):
    """Guards against token-budget steps that drop or repeat a trajectory, overflow the budget, depend on the shuffle
    for their count, or restart the epoch on resume: every row is trained once an epoch, every step of several rows
    pads to <= the budget, each epoch has the same steps count in another order, and a loader restored from a
    mid-epoch state yields the same remaining steps."""
    tokenizer = AutoTokenizer.from_pretrained(workspace / "model")
    data = TrajectoryDataset(str(write_rows(mixed_length_rows(60), tmp_path / "mixed.parquet")), tokenizer, 4096)
    lengths = [len(p) + len(r) for p, r in zip(data.prompt_ids, data.response_ids, strict=True)]
    budget = 3 * max(lengths)
    loader = TokenBudgetLoader(data, budget, shuffle=True, seed=3)
    epochs = []
    for _ in range(2):
        steps = [list(batch["row"]) for batch in loader]
        assert sorted(i for rows in steps for i in rows) == list(range(60))
        for rows in steps:
            padded = len(rows) * (max(len(data.prompt_ids[i]) for i in rows) + max(len(data.response_ids[i])
                                                                                   for i in rows))
            assert len(rows) == 1 or padded <= budget, (rows, padded)
        epochs.append(steps)
    assert len(epochs[0]) == len(epochs[1]) < 60 / 2 and epochs[0] != epochs[1]
    assert max(len(rows) for rows in epochs[0]) > min(len(rows) for rows in epochs[0])  # short rows, more a step
    loader = TokenBudgetLoader(data, budget, shuffle=True, seed=3)
    stream = iter(loader)
    [next(stream) for _ in range(4)]
    restored = TokenBudgetLoader(data, budget, shuffle=True, seed=3)
    restored.load_state_dict(loader.state_dict())
    assert [list(batch["row"]) for batch in restored] == epochs[0][4:]


def test_token_budget_steps_weigh_every_policy_token_the_same(workspace, tmp_path):
    """Guards against dividing a token-budget step's loss by its own token count (a token in a step of many short
    rows would then weigh less than one in a step of a few long rows): each step's loss is its policy tokens' summed
    NLL over one constant, the epoch's mean policy tokens per step, while the logged loss stays the token mean; and
    a run on such steps trains (the loss falls) and resumes exactly."""
    data = write_rows(mixed_length_rows(48), tmp_path / "mixed.parquet")
    out = tmp_path / "run"
    argv = args(workspace, out, f"data.train_files={data}", "data.train_batch_tokens=600", "optim.lr=3e-3",
                "trainer.save_freq=3", "trainer.total_epochs=2")
    cfg = load_sft_config(argv)
    trainer = SFTTrainer(cfg)
    steps = trainer.loader.steps(0)
    divisor = trainer.loader.policy_tokens_per_step()
    assert divisor == pytest.approx(trainer.train_set.policy_tokens() / len(steps))
    tokens = [float(trainer.train_set.batch(rows)["loss_mask"].sum()) for rows in steps]
    assert min(tokens) < divisor < max(tokens)  # the steps differ, so the two divisors differ
    for rows in (steps[tokens.index(min(tokens))], steps[tokens.index(max(tokens))]):
        batch = trainer.train_set.batch(rows)
        mask = batch["loss_mask"].float()
        with torch.no_grad():
            log_prob, _ = response_log_probs(trainer.model, batch, trainer.device, trainer.dtype)
            loss, metrics = trainer._micro_batch_loss(batch, GlobalCounts(tokens=float(mask.sum()), seqs=len(rows)))
        nll = -float((log_prob * mask).sum())
        assert float(loss) == pytest.approx(nll / divisor, rel=1e-5)
        assert metrics["loss"] == pytest.approx(nll / float(mask.sum()), rel=1e-5)
    trainer.tracker.close()
    shutil.rmtree(out)
    assert main(argv) == 0
    first = losses(out)
    assert sorted(first) == list(range(1, 2 * len(steps) + 1))
    assert sum(first[k] for k in sorted(first)[-3:]) < sum(first[k] for k in sorted(first)[:3]) / 2
    last = max(first)
    shutil.rmtree(out / f"global_step_{last}")
    shutil.rmtree(out / "hf_model")
    assert main(argv) == 0
    assert losses(out) == pytest.approx(first, rel=1e-6)


def copy_text_rows(n: int) -> list[dict]:
    """Text rows: an instruction and a number sequence (context), then the same sequence (trained)."""
    rows = []
    for i in range(n):
        seq = " ".join(str((7 * i + 3 * k) % 10) for k in range(2 + i % 5))
        rows.append({"turns": [{"text": "Search, then answer:", "sampled": False},
                               {"text": " " + seq, "sampled": False}, {"text": " " + seq, "sampled": True}]})
    return rows


def test_text_rows_take_their_context_as_prompt_and_train_the_rest(workspace, tmp_path):
    """Guards against text rows whose context is trained or whose trained turn is lost (the leading unsampled turns
    are the prompt, the loss mask covers exactly the repeat) and against a chat template applied to them."""
    from verl.utils.sft_dataset import TextDataset

    tokenizer = AutoTokenizer.from_pretrained(workspace / "model")
    data = TextDataset(str(_write_table(tmp_path / "mix.parquet", copy_text_rows(6))), tokenizer, 4096)
    for k, row in enumerate(copy_text_rows(6)):
        context = tokenizer("".join(t["text"] for t in row["turns"][:2]), add_special_tokens=False)["input_ids"]
        repeat = tokenizer(row["turns"][2]["text"], add_special_tokens=False)["input_ids"]
        assert data.prompt_ids[k] == context and data.response_ids[k] == repeat, k
    batch = data.batch([0, 4])
    assert batch["loss_mask"].sum().item() == len(data.response_ids[0]) + len(data.response_ids[4])


def test_mix_rows_add_their_loss_weighted_and_resume_exactly(workspace, tmp_path):
    """Guards against a second objective that is not trained, ignores its weight, or restarts its row order on
    resume: with data.mix_loss_coef=0 the weights equal a run without mix rows; with 1 they differ and
    train/mix_loss is logged every step; a run resumed from step 2 logs the same mix losses as the uninterrupted
    one (the mix rows of steps 3-4 are not those of steps 1-2)."""
    mix = _write_table(tmp_path / "mix.parquet", copy_text_rows(16))
    base = ["trainer.total_training_steps=4", "optim.lr=3e-3", "trainer.save_freq=2"]
    plain, zero, mixed = tmp_path / "plain", tmp_path / "zero", tmp_path / "mixed"
    assert main(args(workspace, plain, *base)) == 0
    assert main(args(workspace, zero, *base, f"data.mix_files={mix}", "data.mix_rows_per_step=4",
                     "data.mix_loss_coef=0")) == 0
    mixed_argv = args(workspace, mixed, *base, f"data.mix_files={mix}", "data.mix_rows_per_step=4")
    assert main(mixed_argv) == 0
    weights = {run: load_file(run / "hf_model" / "model.safetensors") for run in (plain, zero, mixed)}
    for name in weights[plain]:
        torch.testing.assert_close(weights[zero][name], weights[plain][name], rtol=0, atol=0)
    assert any(not torch.equal(weights[mixed][n], weights[plain][n]) for n in weights[plain])
    records = [json.loads(line) for line in (mixed / "metrics.jsonl").read_text().splitlines()]
    first = [r["train/mix_loss"] for r in records]
    assert len(first) == 4 and all(v > 0 for v in first)
    shutil.rmtree(mixed / "global_step_4")
    shutil.rmtree(mixed / "hf_model")
    assert main(mixed_argv) == 0
    again = [json.loads(line)["train/mix_loss"] for line in (mixed / "metrics.jsonl").read_text().splitlines()]
    assert again == pytest.approx(first, rel=1e-6)


def _write_table(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("case", ["rl_parquet", "not_parquet", "bad_turn", "too_long", "unknown_key", "betas",
                                  "scheduler", "mix_starts_sampled", "mix_too_few"])
def test_bad_input_fails_naming_it(workspace, tmp_path, capsys, case):
    """Guards against tracebacks or silent truncation on bad input: each is exit 2 with a message naming the file,
    column, row or key and the fix."""
    data = tmp_path / "data.parquet"
    extra: list[str] = []
    if case == "rl_parquet":  # an RL parquet given as SFT data: no turns
        rows_to_parquet([make_row("toy", question(1), ["x"], "train", 0)], data)
        expected = ["lacks the column 'turns'", str(data)]
    elif case == "not_parquet":
        data.write_text("question,answer\n")
        expected = [f"{str(data)!r} is not a readable parquet file"]
    elif case == "bad_turn":
        row = scripted_rows([1])[0]
        _write_table(data, [{**row, "turns": [{"text": "<answer> x </answer>", "sampled": None}]}])
        expected = ["row 0 of", "a turn must be {text: str, sampled: bool}"]
    elif case == "too_long":
        write_rows(scripted_rows(range(16)), data)
        extra = ["data.max_length=60"]
        expected = ["row 0 of", "> data.max_length=60", "trajectories are never cut"]
    elif case == "betas":
        write_rows(scripted_rows(range(8)), data)
        extra = ["optim.betas=[0.9]"]
        expected = ["optim.betas=[0.9] is invalid", "two numbers in [0, 1)"]
    elif case == "scheduler":
        write_rows(scripted_rows(range(8)), data)
        extra = ["optim.lr_scheduler=linear"]
        expected = ["optim.lr_scheduler", "linear", "cosine"]
    elif case == "mix_starts_sampled":  # a text row with no context before its trained turn
        write_rows(scripted_rows(range(16)), data)
        mix = _write_table(tmp_path / "mix.parquet", [{"turns": [{"text": "1 2", "sampled": True}]}])
        extra = [f"data.mix_files={mix}"]
        expected = ["text row 0 of", str(mix), "starts with a context turn"]
    elif case == "mix_too_few":
        write_rows(scripted_rows(range(16)), data)
        mix = _write_table(tmp_path / "mix.parquet", copy_text_rows(3))
        extra = [f"data.mix_files={mix}"]
        expected = ["data.mix_rows_per_step=8 is invalid", "holds 3 rows"]
    else:
        write_rows(scripted_rows(range(8)), data)
        extra = ["data.max_len=10"]
        expected = ["unknown config key 'data.max_len'"]
    code = main([f"model.partial_pretrain={workspace / 'model'}", f"data.train_files={data}",
                 f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.logger=[jsonl]", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert all(text in err for text in expected), err
    assert "Traceback" not in err


def _file_size_limit(limit: int):
    """For ``subprocess.run(preexec_fn=...)``: writing past ``limit`` bytes of any file fails with EFBIG (a real
    write error from the kernel, as on a full disk; SIGXFSZ ignored so the process is not killed by it)."""
    import resource
    import signal

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow  # new interpreters
def test_a_failed_save_deletes_its_partial_checkpoint_and_says_which_one_a_rerun_resumes_from(workspace, tmp_path):
    """Guards against a checkpoint write that fails (the disk filled up during ``make demo-real``'s last save) ending
    in a traceback of torch's internals ("unexpected pos 704 vs 598") and leaving its partial ``.tmp`` directory on
    the full disk: the process exits 2 with one message naming the step, the free space and the intact checkpoint a
    rerun resumes from; nothing partial is left; the rerun, with room, resumes there and ends as an uninterrupted
    run."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "verl.trainer.main_sft", *args(workspace, out, "trainer.save_freq=2",
                                                                 "optim.lr=1e-3", "trainer.total_training_steps=4")]
    assert subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT).returncode == 0
    first = losses(out)
    largest = max(f.stat().st_size for f in (out / "global_step_4").rglob("*") if f.is_file())
    shutil.rmtree(out / "global_step_4")
    shutil.rmtree(out / "hf_model")
    # the rerun resumes from step 2, trains steps 3-4 and cannot write step 4's largest file
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          preexec_fn=_file_size_limit(largest // 2))
    assert done.returncode == 2, done.stderr
    assert f"saving the checkpoint of step 4 under {out} failed (" in done.stderr, done.stderr
    assert f"the last complete checkpoint, {out / 'global_step_2'} (" in done.stderr
    assert "Traceback" not in done.stderr and re.search(r"the disk there has [0-9.]+ [MG]iB free", done.stderr)
    assert sorted(p.name for p in out.glob("global_step_*")) == ["global_step_2"]  # no global_step_4.tmp left
    checkpoint.verify(out / "global_step_2", ["model"])  # intact
    assert subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT).returncode == 0
    assert losses(out) == pytest.approx(first, rel=1e-6) and (out / "hf_model" / "model.safetensors").is_file()


@pytest.mark.slow  # a new interpreter
def test_the_command_refuses_a_bad_key_with_exit_status_2(tmp_path):
    """Guards against ``python -m verl.trainer.main_sft`` exiting 0 or 1 (a traceback) on a config error: the process
    itself exits 2 naming the key, before it writes anything; --help (in this process) is exit 0."""
    done = subprocess.run([sys.executable, "-m", "verl.trainer.main_sft", "optim.learning_rate=1e-5",
                           f"trainer.default_local_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "unknown config key 'optim.learning_rate'" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()
    shown = in_process("verl.trainer.main_sft", "--help")
    assert shown.returncode == 0 and "model.partial_pretrain" in shown.stdout
