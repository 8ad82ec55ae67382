"""Every error a user can cause reads as a message: one test per class of bad input, given to the real entry
points (the trainer, evaluate, data prep and the index tools, as subprocesses or through their ``main``).

Each asserts exit status 2, a message naming the bad value or file (and what is allowed), and no traceback. The
trainer's refused launches run its ``main`` in this process (``tests/entry_points.py``: the same command without
the interpreter start).
Classes: values (config keys and flags), model directories, checkpoints, parquet files, output paths and
unreachable services. The service's header-size limit (431) is in tests/retrieval_server/test_bad_input.py.
Everything is real and tiny: a 2-layer model, 8-row parquets, a 1-step training run for the checkpoint.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep import qa_search
from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import save_tiny_model
from retrieval_server.index.build import build_index
from retrieval_server.launcher import free_port
from search_r1 import evaluate
from search_r1.prompts import make_prompt
from tests.entry_points import in_process, main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import copy_run, trained_run_args
from verl.config import DEMO_CONFIG

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    return tiny_workspace(tmp_path_factory.mktemp("user_errors"))


def tiny_workspace(root: Path) -> Path:
    """A tiny policy (``model``), ``train.parquet`` (8 rows) and ``test.parquet`` (4 rows) in ``root``."""
    questions = [f"Who founded the guild number {i} of Vuzaholm" for i in range(8)]
    texts = [make_prompt(q) for q in questions] + ["the answer is <answer> here </answer> <search> q </search>"] * 10
    save_tiny_model(root / "model", texts, vocab_size=600)
    rows = [make_row("toy", q, [f"name {i}"], "train", i) for i, q in enumerate(questions)]
    rows_to_parquet(rows, root / "train.parquet")
    rows_to_parquet(rows[:4], root / "test.parquet")
    return root


def run(module: str, *args: object, timeout: float = 300, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    """``python -m module args`` from the repository root (``env``: variables added to this process's)."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def assert_refused(done: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit status 2, each fragment in the message on stderr, no traceback anywhere."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    for fragment in fragments:
        assert fragment in done.stderr, (fragment, done.stderr[-4000:])


def assert_main_refused(code: int, capsys, *fragments: str) -> None:
    """The same for an in-process ``main(argv)`` (an exception escaping it fails the test by itself)."""
    err = capsys.readouterr().err
    assert code == 2, err[-4000:]
    assert "Traceback" not in err, err[-4000:]
    for fragment in fragments:
        assert fragment in err, (fragment, err[-4000:])


def train_args(ws: Path, out: Path, *extra: str) -> list[str]:
    """A 1-step run of the tiny policy without search, saving a checkpoint after the step."""
    return ["--config", DEMO_CONFIG, f"data.train_files={ws / 'train.parquet'}",
            f"data.val_files={ws / 'test.parquet'}", f"actor_rollout_ref.model.path={ws / 'model'}",
            "actor_rollout_ref.rollout.name=hf", "data.train_batch_size=4", "data.max_trajectory_length=16",
            "data.max_obs_length=16", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_mini_batch_size=4",
            "critic.ppo_micro_batch_size_per_gpu=2", "do_search=false", "trainer.total_training_steps=1",
            "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.val_before_train=false",
            "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}", *extra]


def eval_argv(ws: Path, out: Path, *extra: str, model: Path | None = None, data: Path | None = None) -> list[str]:
    return ["--model", str(model or ws / "model"), "--data", str(data or ws / "test.parquet"), "--out", str(out),
            *extra]


def damaged_copy(ws: Path, dest: Path, name: str, content: bytes | None = None, keep: int | None = None) -> Path:
    """A copy of the tiny model whose file ``name`` is replaced by ``content`` or cut to ``keep`` bytes."""
    shutil.copytree(ws / "model", dest)
    data = (dest / name).read_bytes()
    (dest / name).write_bytes(content if content is not None else data[:keep])
    return dest


def test_values_outside_what_a_key_or_flag_allows(ws, tmp_path):
    """Guards against a value that cannot work passing the checks and failing later as a traceback: a negative
    sampling temperature (deep in generation, for the trainer and evaluate), a port beyond 65535 (uvicorn bound
    another port without a word) or one already in use (a uvicorn exit 3 after the index had loaded)."""
    negative = train_args(ws, tmp_path / "run", "actor_rollout_ref.rollout.temperature=-1")
    assert_refused(main_ppo_in_process(*negative),
                   "actor_rollout_ref.rollout.temperature=-1.0 is invalid: allowed a sampling temperature "
                   "(0 = greedy), a number in [0, 10]")
    assert_refused(in_process("search_r1.evaluate", *eval_argv(ws, tmp_path / "eval", "--n", "2", "--temperature",
                                                              "-1")),
                   "--temperature must be in [0, 10] (0 = greedy), got -1.0")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "Paris is the capital of France."}\n')
    build_index(corpus, tmp_path / "index", retriever="bm25", progress=False)
    serve = ("retrieval_server.serve", "--index", tmp_path / "index", "--corpus", corpus)
    assert_refused(run(*serve, "--port", "99999"), "--port must be between 0 and 65535, got 99999")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_refused(run(*serve, "--port", port), f"cannot listen on 127.0.0.1:{port} (Address already in use); "
                                                    "another process listens there")


def test_damaged_model_directories(ws, tmp_path, capsys):
    """Guards against a truncated weights file or a corrupt config.json / tokenizer.json given as the policy (the
    trainer), as --model (evaluate) or as the encoder (build_index) ending in a traceback from safetensors or
    transformers, in the trainer's case from inside a worker after the run had started."""
    truncated = damaged_copy(ws, tmp_path / "truncated", "model.safetensors", keep=100_000)
    done = main_ppo_in_process(*train_args(ws, tmp_path / "run", f"actor_rollout_ref.model.path={truncated}"))
    assert_refused(done, f"config key actor_rollout_ref.model.path='{truncated}' is invalid: model.safetensors is "
                         "damaged or truncated (100,000 bytes")
    bad_config = damaged_copy(ws, tmp_path / "bad_config", "config.json", b'{"model_type": "qwen2", "hidden_size": ')
    assert_main_refused(evaluate.main(eval_argv(ws, tmp_path / "eval", model=bad_config)), capsys,
                        f"--model {bad_config}: config.json is not valid JSON")
    bad_tokenizer = damaged_copy(ws, tmp_path / "bad_tokenizer", "tokenizer.json", b'{"version": "1.0", "trunc')
    assert_main_refused(evaluate.main(eval_argv(ws, tmp_path / "eval", model=bad_tokenizer)), capsys,
                        f"--model {bad_tokenizer}: tokenizer.json is not valid JSON")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "Paris is the capital of France."}\n')
    assert_refused(run("retrieval_server.build_index", "--corpus", corpus, "--out", tmp_path / "index", "--model",
                       truncated), f"encoder --model {truncated} does not load (SafetensorError")


def test_damaged_checkpoint_on_resume(workspace, trained_run, tmp_path):
    """Guards against a checkpoint whose shard was cut short (a full disk, an interrupted copy) passing the
    checks and failing as a traceback from torch.distributed.checkpoint when the workers load it (the README
    promises exit 2 for an unusable checkpoint). The run is a copy of the shared trained run as it stood after
    step 1."""
    out = copy_run(trained_run, tmp_path / "run", 1)
    (shard,) = (out / "global_step_1" / "actor").glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:10_000])
    assert_refused(main_ppo_in_process(*trained_run_args(workspace, out, 2)),
                   f"checkpoint {out / 'global_step_1'} is incomplete or corrupt: actor/{shard.name} is truncated "
                   "(10,000 bytes", f"delete {out / 'global_step_1'} to resume from the checkpoint before it")


def test_bad_parquet_files_in_evaluate(ws, tmp_path, capsys):
    """Guards against the parquet mistakes the trainer names (no rows, a row without golden answers, not a parquet
    file, missing columns) ending in a traceback (or a KeyError mid-run) in evaluate."""
    rows = [make_row("toy", f"Who founded guild {i}", [f"name {i}"], "test", i) for i in range(3)]
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist(rows).slice(0, 0), empty)
    no_answer = tmp_path / "no_answer.parquet"
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": {"target": []}}
    pq.write_table(pa.Table.from_pylist(rows), no_answer)
    not_parquet = tmp_path / "questions.parquet"
    not_parquet.write_text("question,answer\nwho?,me\n")
    no_reward = tmp_path / "no_reward.parquet"
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "reward_model"} for r in rows]), no_reward)
    for data, message in [(empty, f"no rows in '{empty}'"),
                          (no_answer, f"row 1 of '{no_answer}': no golden answer"),
                          (not_parquet, f"--data {not_parquet}: not a parquet file"),
                          (no_reward, f"--data {no_reward}: missing column(s) reward_model")]:
        code = evaluate.main(eval_argv(ws, tmp_path / f"out_{data.stem}", "do_search=false", data=data))
        assert_main_refused(code, capsys, message)


def test_output_paths_that_name_a_file(ws, tmp_path, capsys):
    """Guards against --out naming an existing file (or a path under one) ending in FileExistsError /
    NotADirectoryError tracebacks from mkdir, in evaluate, data prep and the index builder."""
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a directory\n")
    assert_main_refused(evaluate.main(eval_argv(ws, a_file)), capsys,
                        f"--out {a_file} is a file; name a directory")
    assert_main_refused(evaluate.main(eval_argv(ws, a_file / "sub")), capsys,
                        f"--out {a_file / 'sub'}: cannot create the directory (Not a directory")
    source = tmp_path / "nq.jsonl"
    source.write_text('{"id": "1", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}\n')
    assert_main_refused(qa_search.main(["--train", f"nq={source}", "--out", str(a_file)]), capsys,
                        f"--out {a_file} is a file; name a directory")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "Paris is the capital of France."}\n')
    assert_refused(run("retrieval_server.build_index", "--corpus", corpus, "--out", a_file, "--retriever", "bm25"),
                   f"--out {a_file} is a file; name a directory for the index")


def test_unreachable_retrieval_service_at_start(ws, tmp_path, capsys):
    """Guards against a retriever URL where nothing listens (a typo, a service not started) ending in a
    RetrievalError traceback from the recipe's health check when the trainer is started directly (the launchers
    refuse it themselves), and in exit status 1 from evaluate, as if the service had failed mid-run."""
    url = f"http://127.0.0.1:{free_port()}"
    done = main_ppo_in_process(*train_args(ws, tmp_path / "run", "do_search=true", f"retriever.url={url}"))
    assert_refused(done, f"retrieval service not answering at {url}", "start it with retrieval_launch.sh")
    assert_main_refused(evaluate.main(eval_argv(ws, tmp_path / "eval", "--retriever-url", url)), capsys,
                        f"retrieval service not answering at {url}", "retrieval_launch.sh")


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_lengths_longer_than_the_models_positions(ws, tmp_path, engine):
    """Guards against lengths beyond the policy's max_position_embeddings (8192 for the tiny model) reaching the
    engine: vLLM's validation traceback, or the HF engine running past the trained positions silently."""
    lengths = ["data.max_prompt_length=16384", "data.max_response_length=500", "data.max_start_length=2048",
               "data.max_trajectory_length=16384"]
    out = tmp_path / "run"
    done = main_ppo_in_process(*train_args(ws, out, f"actor_rollout_ref.rollout.name={engine}", *lengths))
    assert_refused(done, "the lengths allow sequences of 16884 tokens, more than the model's "
                         "max_position_embeddings=8192", "data.max_prompt_length + data.max_response_length = "
                         "16384 + 500")
    assert not out.exists()
