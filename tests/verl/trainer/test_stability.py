"""The trainer under faults, through the real entry point: NaN updates, a retrieval service that dies,
kill -9 at random moments, bad data and config (tiny model, HF rollout, real services, no mocks).

Guards against: a NaN reaching the weights or a run that trains on for ever on skipped updates; a
retriever outage that ends the run without a checkpoint, loses a step or trains a step on empty
results; a kill that resumes at the wrong step or from a half-written checkpoint; bad inputs that
surface as tracebacks instead of errors naming the problem.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from data_prep.qa_search import make_row, rows_to_parquet
from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess, free_port
from search_r1.llm_agent.formatting import INFO_CLOSE
from tests.entry_points import main_ppo_in_process
from tests.verl.trainer.trainer_test_utils import ROOT, metrics, overrides
from verl.utils import checkpoint

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

NAN_AFTER_FIRST_STEP = '''
calls = 0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """The toy 'e' reward for the first 4 rows (step 1), NaN from then on."""
    global calls
    calls += 1
    return solution_str.count("e") / max(len(solution_str), 1) if calls <= 4 else float("nan")
'''


class Run:
    """``python -m verl.trainer.main_ppo`` in its own session, its output in a file (readable while it runs)."""

    def __init__(self, args: list[str], log: Path):
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=ROOT,
                                         env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, condition, timeout: float = 600, poll: float = 0.1) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, f"the run ended early:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, self.text()[-3000:]
            time.sleep(poll)

    def finish(self, timeout: float = 600) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def runs():
    """``runs(args, log)`` starts a ``Run``; whatever is left of every run is killed at teardown."""
    started: list[Run] = []

    def start(args: list[str], log: Path) -> Run:
        started.append(Run(args, log))
        return started[-1]

    yield start
    for run in started:
        run.kill()


def test_nan_updates_are_skipped_then_the_run_stops_naming_step_quantity_and_checkpoint(workspace, tmp_path):
    """From step 2 every reward is NaN: the updates are skipped and counted, and after
    trainer.max_skipped_updates=2 such steps the run stops (exit 3) naming the step, the quantity and the
    last good checkpoint. Also: the mismatch metrics of the fp32 HF engine are ~0 and the entropy alarm fires."""
    (tmp_path / "nan_reward.py").write_text(NAN_AFTER_FIRST_STEP)
    out = tmp_path / "run"
    reward = f"custom_reward_function.path={tmp_path / 'nan_reward.py'}"
    done = main_ppo_in_process(*overrides(workspace, out, 6, reward, "trainer.max_skipped_updates=2",  # here
                                          "trainer.alarm_entropy_below=1000"))
    log = done.stdout + done.stderr
    assert done.returncode == 3, log[-3000:]
    assert (f"stopped at step 3: the actor update was skipped 2 steps in a row (trainer.max_skipped_updates=2) "
            f"because a advantage was NaN/Inf; last good checkpoint: {out / 'global_step_1'}") in log
    assert f"saved the last finite weights as checkpoint {out / 'global_step_3'}" in log
    assert checkpoint.find_latest(out) == out / "global_step_3"
    assert "HEALTH ALARM entropy_collapse at step 1" in log
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2]  # step 3 stopped the run before it was logged
    assert records[0]["actor/skipped_updates"] == 0 and records[1]["actor/skipped_updates"] == 2
    assert records[1]["actor/nonfinite_advantages"] == 1
    assert records[0]["health/entropy_collapse"] == 1 and records[0]["health/clipfrac_explosion"] == 0
    assert records[0]["rollout/logprob_diff_max"] < 1e-4 and records[0]["rollout/kl_k3"] < 1e-8
    assert not (out / "hf_model").exists()


CORPUS = [(f"guild{i}", f"Guild {i} of Vuzaholm", f"The guild number {i} of Vuzaholm was founded by name {i}.")
          for i in range(16)]
SEARCH = "<search> guild of Vuzaholm </search>"


def search_rows() -> list[dict]:
    return [make_row("toy", f"Who founded the guild number {i} of Vuzaholm", [f"name {i}"], "train", i)
            for i in range(16)]


def searching_model(ws: Path, out: Path) -> Path:
    """The workspace's tiny model turned into a policy that searches on every turn: its layers' outputs are
    zeroed (the last token alone decides the next) and an untied LM head maps the prompt's last token and the
    information block's last token to ``<search>``, and each token of ``SEARCH`` to the next. A real HF model
    whose every turn needs the service."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ws / "model")
    model = AutoModelForCausalLM.from_pretrained(ws / "model")
    chain = tokenizer(SEARCH, add_special_tokens=False)["input_ids"]
    prompt = tokenizer.apply_chat_template(search_rows()[0]["prompt"], add_generation_prompt=True, tokenize=True)
    prompt_end = list(prompt["input_ids"] if hasattr(prompt, "input_ids") else prompt)[-1]
    info_end = tokenizer(INFO_CLOSE, add_special_tokens=False)["input_ids"][-1]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        final = model.model.norm(model.model.embed_tokens.weight)  # [V, H]: the last hidden state after token x
        head = torch.nn.Linear(final.shape[1], final.shape[0], bias=False)
        head.weight.copy_(0.1 * model.model.embed_tokens.weight)
        for x, y in [(prompt_end, chain[0]), (info_end, chain[0]), *zip(chain[:-1], chain[1:])]:
            head.weight[y] += 3.0 * final[x] / final[x].norm()
    model.lm_head = head
    model.config.tie_word_embeddings = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def search_setup(workspace, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("search")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n" for i, t, x in CORPUS))
    build_index(corpus, root / "index", retriever="bm25", progress=False)
    rows_to_parquet(search_rows(), root / "train.parquet")
    return {"model": searching_model(workspace, root / "model"), "index": root / "index", "corpus": corpus,
            "train": root / "train.parquet"}


def search_overrides(ws: Path, setup: dict, out: Path, port: int, outage_s: float, *extra: str) -> list[str]:
    return overrides(ws, out, 4, *extra, f"actor_rollout_ref.model.path={setup['model']}",
                     f"data.train_files={setup['train']}", "do_search=true", f"retriever.url=http://127.0.0.1:{port}",
                     f"retriever.outage_timeout_s={outage_s}", "max_turns=2", "data.max_trajectory_length=48",
                     "retriever.topk=1", "actor_rollout_ref.actor.optim.lr=1e-5")


def start_server(setup: dict, port: int) -> ServerProcess:
    server = ServerProcess(setup["index"], setup["corpus"], ["--threads", "1"], port=port)
    server.wait_ready()
    return server


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_retriever_outage_is_survived_or_ends_with_a_checkpoint_and_no_step_lost(workspace, search_setup, tmp_path,
                                                                                 runs, mode):
    """In both rollout modes. A: the service is killed (SIGKILL) after step 1 and restarted after the client has
    logged its waits: the run goes on. B: killed after step 1 with a 2 s outage budget: the run saves, stops
    (exit 3) naming the URL and the checkpoint of its last finished step; rerun with the service back (a rerun that
    must finish: its main in this process, tests/entry_points.py), it resumes after that step. Both give, step for
    step, the same metrics as each other (nothing was trained on empty results, no step was lost or repeated)."""
    port = free_port()
    server = start_server(search_setup, port)
    try:
        extra = f"actor_rollout_ref.rollout.mode={mode}"
        a = runs(search_overrides(workspace, search_setup, tmp_path / "a", port, 300, extra), tmp_path / "a.log")
        a.wait_for(lambda: (tmp_path / "a" / "global_step_1").exists())
        server.proc.kill()
        server.stop()
        a.wait_for(lambda: a.text().count("retrieval at ") >= 3)  # three logged waits, then the service returns
        server = start_server(search_setup, port)
        assert a.finish() == 0, a.text()[-3000:]
        assert "retriever.outage_timeout_s=300" in a.text()

        b = runs(search_overrides(workspace, search_setup, tmp_path / "b", port, 2, extra), tmp_path / "b.log")
        b.wait_for(lambda: (tmp_path / "b" / "global_step_1").exists())
        server.proc.kill()  # a step takes ~0.4 s, and its searches start ~30 ms after the previous checkpoint:
        server.stop()  # the run may finish step 2 or 3 before the kill lands, never all four
        assert b.finish() == 3, b.text()[-3000:]
        assert f"retrieval service at http://127.0.0.1:{port}/retrieve failed for" in b.text()
        stopped = re.search(r"stopped after step (\d) \(saved checkpoint (\S+)\)", b.text())
        assert stopped, b.text()[-3000:]
        last = int(stopped.group(1))
        assert 1 <= last <= 3 and stopped.group(2) == str(tmp_path / "b" / f"global_step_{last}")
        assert checkpoint.complete_steps(tmp_path / "b") == list(range(1, last + 1))
        server = start_server(search_setup, port)
        resumed = main_ppo_in_process(*search_overrides(workspace, search_setup, tmp_path / "b", port, 2, extra))
        text = resumed.stdout + resumed.stderr  # a rerun that must finish: in this process (tests/entry_points.py)
        assert resumed.returncode == 0, text[-3000:]
        assert f"resuming from {tmp_path / 'b' / f'global_step_{last}'}" in text
    finally:
        server.stop()
    ra, rb = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [1, 2, 3, 4]
    for x, y in zip(ra, rb, strict=True):
        assert x["agent/searches_per_traj"] >= 1, "the policy must search for the test to mean anything"
        for key in ("critic/score/mean", "agent/searches_per_traj", "actor/pg_loss", "critic/vf_loss"):
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-7), (x["step"], key)


def test_kill_9_at_random_moments_resumes_at_the_right_step(workspace, tmp_path, runs):
    """SIGKILL three times (a random moment after a step, the moment a checkpoint is being written, a random
    moment after a resume), then run to the end: every restart resumes from the newest committed checkpoint
    (never a .tmp one), and the metrics hold each step exactly once. The run keeps two checkpoints (verl's
    trainer.max_actor_ckpt_to_keep), so the kills also land around deletions: the two newest are left."""
    out, rng = tmp_path / "run", random.Random(14)
    args = overrides(workspace, out, 5, "trainer.max_actor_ckpt_to_keep=2")

    def written_since(start_ns: int) -> bool:
        """A ``.tmp`` checkpoint directory made by this run (a killed run may have left an older one)."""
        for tmp in out.glob("global_step_*.tmp"):
            with contextlib.suppress(FileNotFoundError):  # renamed meanwhile
                if tmp.stat().st_mtime_ns >= start_ns:
                    return True
        return False

    for kill in range(4):
        expected = checkpoint.find_latest(out)
        start_ns = time.time_ns()
        run = runs(args, tmp_path / f"log{kill}")
        if kill == 3:
            assert run.finish() == 0, run.text()[-3000:]
        elif kill == 1:  # during a checkpoint write: its .tmp directory exists, the rename has not happened yet
            run.wait_for(lambda start_ns=start_ns: written_since(start_ns), poll=0.005)
            run.kill()
        else:
            done = max(checkpoint.complete_steps(out), default=0)
            run.wait_for(lambda done=done: max(checkpoint.complete_steps(out), default=0) > done)  # a step more
            time.sleep(rng.uniform(0.0, 3.0))
            run.kill()
        resumed = re.findall(r"resuming from (\S+)", run.text())
        assert resumed == ([] if expected is None else [str(expected)]), (kill, expected, run.text()[-2000:])
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5]
    assert checkpoint.complete_steps(out) == [4, 5] and not list(out.glob("*.tmp"))
    assert (out / "hf_model").exists()


def test_bad_model_path_and_corrupt_checkpoint_exit_2_naming_the_problem(workspace, tmp_path):
    """Through the entry point's main (in this process: tests/entry_points.py): no traceback, exit status 2 and a
    message naming the key or the directory."""
    missing = f"actor_rollout_ref.model.path={tmp_path / 'missing'}"
    done = main_ppo_in_process(*overrides(workspace, tmp_path / "a", 1, missing))
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    assert f"error: config key actor_rollout_ref.model.path='{tmp_path / 'missing'}' is invalid: no such directory" \
        in text and "Traceback" not in text
    damaged = tmp_path / "b" / "global_step_1"
    (damaged / "actor").mkdir(parents=True)
    (damaged / "trainer.pt").write_bytes(b"half a checkpoint")
    done = main_ppo_in_process(*overrides(workspace, tmp_path / "b", 1))
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    assert f"error: checkpoint {damaged} is incomplete or corrupt: missing config.yaml, actor/.metadata" in text
    assert "trainer.resume_mode=disable" in text and "Traceback" not in text
