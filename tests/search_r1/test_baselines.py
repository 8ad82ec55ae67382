"""The paper's baselines through ``search_r1.evaluate`` (``--mode direct | rag``) and search disabled
(``max_turns=0``, R1's flag) in evaluation and in training, against the real retrieval service on loopback, whose
own per-interval log counts the ``/retrieve`` requests it answered."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from retrieval_server.launcher import ServerProcess
from search_r1.evaluate import main
from search_r1.prompts import NO_SEARCH_INSTRUCTION
from tests.entry_points import main_ppo_in_process
from tests.search_r1.memorised_policy import QUESTIONS, TOPK
from tests.verl.trainer.trainer_test_utils import overrides

pytestmark = pytest.mark.slow  # starts services, engines and a trainer: not in `make test-fast`

FRANCE, TOKYO = QUESTIONS
ROWS = [("nq", FRANCE, ["Paris"]), ("nq", TOKYO, ["Japan"]), ("nq", "Who discovered polonium", ["Marie Curie"])]
# the service's summary line (retrieval_server/logs.py): requests and queries answered in one interval
SUMMARY = re.compile(r"retrieval: (?P<requests>[\d,]+) requests, (?P<queries>[\d,]+) queries in ")


@pytest.fixture(scope="module")
def counted_service(retrieval_index):
    """The retrieval service over the test corpus, logging its request counts every 0.2 s."""
    corpus, index = retrieval_index
    with ServerProcess(index, corpus, ["--threads", "1", "--log-interval", "0.2"]) as server:
        server.wait_ready()
        yield server


def retrieve_counts(server: ServerProcess) -> tuple[int, int]:
    """(requests, queries) the service answered so far, once its last interval has been logged."""
    time.sleep(0.8)  # past the interval in which the last request came
    matches = list(SUMMARY.finditer(server.log_text()))
    return (sum(int(m["requests"].replace(",", "")) for m in matches),
            sum(int(m["queries"].replace(",", "")) for m in matches))


@pytest.fixture(scope="module")
def test_parquet(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "test.parquet"
    rows_to_parquet([make_row(source, question, golden, "test", i) for i, (source, question, golden)
                     in enumerate(ROWS)], path)
    return path


def evaluate(policy, data: Path, url: str, out: Path, *extra: str) -> list[dict]:
    """A greedy evaluation in this process -> its trajectory records."""
    assert main(["--model", str(policy[0]), "--data", str(data), "--retriever-url", url, "--out", str(out),
                 "--batch-size", "8", *extra, f"retriever.topk={TOPK}"]) == 0
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


def nothing_inserted(records: list[dict]) -> None:
    for r in records:
        assert r["inserted_tokens"] == 0 and r["searches"] == 0 and r["queries"] == [], r
        assert [s["kind"] for s in r["segments"]] == ["policy"], r["segments"]


def test_direct_mode_makes_no_retrieval_call(policy, test_parquet, counted_service, tmp_path):
    """Guards against a Direct baseline that searches, inserts passages or keeps the search prompt: no request reaches
    the service, nothing is inserted, and the prompt offers no search."""
    before = retrieve_counts(counted_service)
    records = evaluate(policy, test_parquet, counted_service.url, tmp_path / "direct", "--mode", "direct")
    assert retrieve_counts(counted_service) == before
    nothing_inserted(records)
    for r in records:
        assert r["prompt"].startswith(NO_SEARCH_INSTRUCTION) and "search" not in r["prompt"].lower()
        assert NO_SEARCH_INSTRUCTION in r["input"] and r["prompt_passages"] == ""
    results = json.loads((tmp_path / "direct" / "results.json").read_text())
    assert results["overall"]["n"] == len(ROWS) and results["overall"]["recall"] == 0.0
    assert json.loads((tmp_path / "direct" / "run.json").read_text())["mode"] == "direct"


def test_rag_mode_retrieves_once_before_generating(policy, test_parquet, counted_service, tmp_path):
    """Guards against a RAG baseline that retrieves per row or per turn, searches again after reading, or generates
    before the passages are in its prompt: exactly one request with every question, its passages in the prompt the
    engine saw, nothing inserted afterwards, and the passages counted as retrieved in the recall."""
    before = retrieve_counts(counted_service)
    records = evaluate(policy, test_parquet, counted_service.url, tmp_path / "rag", "--mode", "rag")
    requests, queries = retrieve_counts(counted_service)
    assert (requests - before[0], queries - before[1]) == (1, len(ROWS))
    nothing_inserted(records)
    france = records[0]
    assert "Doc 1(Title: Paris)" in france["prompt_passages"]  # BM25's top passage for the question itself
    assert france["prompt_passages"] in france["input"] and FRANCE in france["input"]
    assert france["input"].index("Doc 1(Title:") < france["input"].index(FRANCE)  # passages, then the question
    results = json.loads((tmp_path / "rag" / "results.json").read_text())
    assert results["overall"]["searches"] == 0.0 and results["overall"]["recall"] > 0


def test_search_disabled_run_makes_no_call_and_masks_nothing(policy, test_parquet, counted_service, tmp_path):
    """Guards against R1's flag (max_turns=0) still searching or inserting an empty block (do_search=false's way,
    which masks the block): the memorised policy writes its search, and it is neither sent nor answered; the row
    ends there with every response token the policy's."""
    _, tokenizer, _, responses, masks = policy
    before = retrieve_counts(counted_service)
    records = evaluate(policy, test_parquet, counted_service.url, tmp_path / "r1", "max_turns=0")
    assert retrieve_counts(counted_service) == before
    nothing_inserted(records)
    searched = responses[0][:masks[0].index(0)]  # the memorised search turn, up to its first inserted token
    assert records[0]["response"] == tokenizer.decode(searched, skip_special_tokens=True)
    assert records[0]["stop_reason"] == "max_turns" and records[0]["response_tokens"] == len(searched)


def test_grpo_trains_with_search_disabled(workspace, unused_url, tmp_path):
    """Guards against R1 needing a second code path or a service: a GRPO step with max_turns=0 and do_search on,
    whose retriever URL has nothing listening, trains without a retrieval call, and its trajectories are the
    policy's tokens only (no inserted block, so the loss masks nothing)."""
    out = tmp_path / "r1"
    done = main_ppo_in_process(*overrides(workspace, out, 1, "do_search=true", "max_turns=0",
                                          f"retriever.url={unused_url}", "algorithm.adv_estimator=grpo",
                                          "actor_rollout_ref.rollout.n=2", "data.train_batch_size=2"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(records) == 4
    for r in records:
        assert r["num_searches"] == 0 and r["turns"] == 1
        assert [s["kind"] for s in r["segments"]] == ["policy"], r["segments"]
    assert "search   disabled (max_turns=0" in done.stdout + done.stderr


def test_paper_table_resumes_and_skips_finished_rows(policy, retrieval_index, test_parquet, tmp_path, capsys,
                                                     monkeypatch):
    """Guards against a table command that redoes finished rows (hours of RL on the real model), loses an
    interrupted row's evaluation, or mixes sizes or engines in one directory: on a data folder in
    ``data_prep.wiki_nq``'s layout, Direct and RAG are evaluated once each into their own directories; a rerun skips
    both; a row whose report is missing is reported again from its written trajectories; another size or engine is
    refused, and so is a dense row on data built without the dense index."""
    from benchmarks import paper_table

    corpus, index = retrieval_index
    data = tmp_path / "data"
    (data / "search_r1").mkdir(parents=True)
    (data / "corpus.jsonl").symlink_to(corpus)
    (data / "bm25").symlink_to(index)
    (data / "search_r1" / "test.parquet").symlink_to(test_parquet)
    out = tmp_path / "table"
    argv = ["--rows", "direct", "rag", "--test-n", "2", "--engine", "hf", "--data", str(data), "--model",
            str(policy[0]), "--out", str(out)]
    assert paper_table.main(argv) == 0
    trajectories = {name: out / name / "eval" / "trajectories.jsonl" for name in ("direct", "rag")}
    written = {name: path.read_text() for name, path in trajectories.items()}
    assert all(len(text.splitlines()) == 2 for text in written.values())
    md = (out / "table.md").read_text()
    assert "| Direct inference |" in md and "| RAG (BM25, top 3) |" in md and (out / "table.png").stat().st_size
    rag = json.loads((out / "rag" / "row.json").read_text())
    assert rag["all"]["n"] == 2 and rag["all"]["recall"] > 0 and rag["all"]["searches"] == 0
    capsys.readouterr()

    assert paper_table.main(argv) == 0
    shown = capsys.readouterr().out
    assert "direct (seed 1) already done" in shown and "rag (seed 1) already done" in shown
    assert "search_r1.evaluate" not in shown  # nothing rolled out again

    (out / "rag" / "row.json").unlink()  # interrupted after its evaluation, before its report
    assert paper_table.main(argv) == 0
    assert {name: path.read_text() for name, path in trajectories.items()} == written  # no trajectory redone
    resumed = json.loads((out / "rag" / "row.json").read_text())
    assert resumed["all"] == rag["all"] and resumed["resumed"] and not rag["resumed"]
    lines = {line.split(" |")[0]: line for line in (out / "table.md").read_text().splitlines()}
    assert lines["| RAG (BM25, top 3)"].endswith("(resumed: the last run's) |")  # its time is partial, and says so
    assert not lines["| Direct inference"].endswith("(resumed: the last run's) |")

    # another clone (or machine) resumes from the row files alone: each finished row's row.json carries the settings
    # it was made with (paths inside the checkout are recorded relative to it, so another clone's default data and
    # model match)
    assert paper_table.portable(paper_table.ROOT / "data" / "wiki_nq") == "data/wiki_nq"
    assert paper_table.portable(data) == str(data.resolve())
    assert rag["settings"] == {"test_n": 2, "data": str(data.resolve()), "model": str(policy[0].resolve()),
                               "engine": "hf", "lengths": {"max_response_length": 320, "max_start_length": 1024}}
    carried = tmp_path / "carried"
    for name in ("direct/row.json", "rag/row.json"):
        (carried / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(out / name, carried / name)
    capsys.readouterr()
    assert paper_table.main([*argv[:-1], str(carried)]) == 0
    shown = capsys.readouterr().out
    assert "direct (seed 1) already done" in shown and "rag (seed 1) already done" in shown
    assert "search_r1.evaluate" not in shown and (carried / "table.md").read_text() == (out / "table.md").read_text()
    # and its row.json alone pairs question by question as its trajectories do (benchmarks/paired_rows.py)
    from benchmarks import paired_rows
    for name in ("direct", "rag"):
        kept_scores, traj_scores = (paired_rows.scores(p) for p in (carried / name / "row.json", trajectories[name]))
        assert kept_scores.test_sha256 == traj_scores.test_sha256 and len(kept_scores.by_row) == 2
        em = {q: v["em"] for q, v in traj_scores.by_row.items()}
        assert {q: v["em"] for q, v in kept_scores.by_row.items()} == em
    # a new --out lacking a row the repository keeps (same settings): the row is named with the copy that skips it
    # before it is made (a table run once re-evaluated the kept SFT row for 10 minutes); a row not kept is not named
    kept = tmp_path / "kept" / "hf" / "direct" / "row.json"
    kept.parent.mkdir(parents=True)
    shutil.copy(out / "direct" / "row.json", kept)
    monkeypatch.setattr(paper_table, "KEPT", tmp_path / "kept")
    capsys.readouterr()
    assert paper_table.main(["--rows", "direct", "rag", *argv[3:-1], str(tmp_path / "fresh")]) == 0
    shown = capsys.readouterr().out
    assert f"direct (seed 1): a finished row made with these settings is kept in the repository; to use it instead " \
           f"of making it again, stop and run: cp {kept} {tmp_path / 'fresh' / 'direct' / 'row.json'}" in shown
    assert "rag (seed 1): a finished row" not in shown

    # each row is checked against the settings it depends on: the RL settings (as --full sets them) leave the
    # baselines as they are, so a --full table reuses a --test-n 1800 table's Direct and RAG rows
    capsys.readouterr()
    assert paper_table.main([*argv[:-1], str(carried), "--steps", "24", "--val-n", "200", "--val-points", "6"]) == 0
    shown = capsys.readouterr().out
    assert "direct (seed 1) already done" in shown and "search_r1.evaluate" not in shown
    with pytest.raises(SystemExit, match=r"row direct \(seed 1\) .* other settings \(test_n 2 there, 3 now\)"):
        paper_table.main([*argv, "--test-n", "3"])
    with pytest.raises(SystemExit, match="other settings .engine 'hf' there, 'vllm' now"):  # never mixes engines
        paper_table.main([*argv, "--engine", "vllm"])
    # a row made before rows recorded their settings cannot be checked: refused, naming the directory to delete
    (out / "direct" / "settings.json").unlink()
    row = json.loads((out / "direct" / "row.json").read_text())
    del row["settings"]
    (out / "direct" / "row.json").write_text(json.dumps(row))
    with pytest.raises(SystemExit, match=rf"row direct .* records no settings .* delete {out / 'direct'} to make it"):
        paper_table.main(argv)
    # a dense row on data built without the dense index: refused before anything runs, naming how to add it
    with pytest.raises(SystemExit, match=rf"rows grpo_dense search the dense index, which {data} lacks .* add it "
                                         rf"with: python -m data_prep.wiki_nq --out {data}$"):
        paper_table.main(["--rows", "direct", "grpo_dense", *argv[3:-1], str(tmp_path / "dense_table")])
    assert not (tmp_path / "dense_table" / "direct").exists()


def test_the_kept_acceptance_size_rows_match_what_a_full_table_asks(tmp_path):
    """The rows kept in benchmarks/paper_table_rows (hours of this machine each) must be the rows a ``--full`` table
    of their engine would make: same settings under the defaults, else copying them in is refused (or, worse, a
    changed default would reuse them silently)."""
    import argparse

    from benchmarks import paper_table

    base = paper_table.ROOT / "benchmarks" / "paper_table_rows"
    kept = sorted(base.rglob("row.json"))  # <engine>/<row>/row.json; an RL row's <engine>/<row>/seed<S>/row.json
    assert {p.relative_to(base).parts[:2] for p in kept} >= {("vllm", "direct"), ("vllm", "rag")}
    for path in kept:
        engine, name, *seed = path.relative_to(base).parent.parts
        row = json.loads(path.read_text())
        # where run_row looks for it once copied into a table's --out: an RL row per seed, any other row once
        assert seed == ([f"seed{row['seed']}"] if paper_table.ROWS[name].policy == "rl" else []), path
        full = argparse.Namespace(test_n=1800, steps=24, val_n=200, val_points=6, engine=engine,
                                  data=paper_table.ROOT / paper_table.DATA, model=paper_table.ROOT / paper_table.MODEL)
        assert row["row"] == name and row["all"]["n"] == 1800 and row["answer_bearing"]["n"] == 714
        settings = paper_table.row_settings(paper_table.ROWS[name], full)
        paper_table.check_settings(tmp_path / name / "settings.json", row["settings"], settings, name, made=True)
        assert paper_table.kept_row(name, row["seed"], engine, settings) == path  # named before a --full remakes it
        assert paper_table.kept_row(name, row["seed"], engine, {**settings, "test_n": 30}) is None
        with pytest.raises(SystemExit, match="other settings"):
            paper_table.check_settings(tmp_path / name / "settings.json", row["settings"], {**settings, "test_n": 30},
                                       name, made=True)


def test_the_tables_training_runs_resume_and_keep_one_checkpoint(tmp_path, monkeypatch):
    """Guards against a table whose 30-60 min cold start starts over after a kill (it saved nothing before its end:
    one session lost 31 of its 41 steps), or whose RL rows fill the disk (six checkpoints, ~11 GiB, per run): the
    SFT and RL commands a Search-R1 row runs save along the way and keep only their newest checkpoint."""
    import argparse

    from benchmarks import paper_table

    commands = []
    monkeypatch.setattr(paper_table, "run", lambda cmd, log: commands.append(cmd))
    args = argparse.Namespace(test_n=30, steps=24, val_n=12, val_points=2, engine="vllm", data=tmp_path / "data",
                              model=tmp_path / "model")

    class Services:
        def url(self, index: str) -> str:
            return f"http://127.0.0.1:1/{index}"

    run_dir = tmp_path / "out" / "grpo_bm25" / "seed1"
    paper_table.train("grpo_bm25", paper_table.ROWS["grpo_bm25"], 1, args, tmp_path / "out", run_dir, Services())
    scripted, sft, rl = commands
    plain_scripted = scripted
    assert [cmd[2] for cmd in commands] == ["data_prep.cold_start", "verl.trainer.main_sft", "verl.trainer.main_ppo"]
    for cmd, steps in ((sft, 41), (rl, args.steps)):
        keys = dict(item.split("=", 1) for item in cmd if "=" in item and item.startswith("trainer."))
        assert 0 < int(keys["trainer.save_freq"]) < steps and keys["trainer.max_ckpt_to_keep"] == "1", cmd
    # the rephrasing cold start: its own scripted trajectories and SFT directory, which its RL row starts from
    commands.clear()
    paper_table.train("grpo_bm25_rephrase", paper_table.ROWS["grpo_bm25_rephrase"], 1, args, tmp_path / "out",
                      tmp_path / "out" / "grpo_bm25_rephrase" / "seed1", Services())
    scripted, sft, rl = commands
    assert scripted[-2:] == ["--rephrase", "8"] and "--rephrase" not in plain_scripted
    assert f"trainer.default_local_dir={tmp_path / 'out' / 'sft_rephrase'}" in sft
    assert f"actor_rollout_ref.model.path={tmp_path / 'out' / 'sft_rephrase' / 'hf_model'}" in rl
    assert "algorithm.adv_estimator=grpo_turn" in rl
    # the phrase-first cold start: phrases tried first for half the questions, its own SFT directory
    commands.clear()
    paper_table.train("grpo_bm25_phrase", paper_table.ROWS["grpo_bm25_phrase"], 1, args, tmp_path / "out",
                      tmp_path / "out" / "grpo_bm25_phrase" / "seed1", Services())
    scripted, sft, rl = commands
    assert scripted[-4:] == ["--rephrase", "8", "--phrase-first", "0.5"]
    assert f"trainer.default_local_dir={tmp_path / 'out' / 'sft_phrase'}" in sft
    assert f"actor_rollout_ref.model.path={tmp_path / 'out' / 'sft_phrase' / 'hf_model'}" in rl


def test_a_start_stopped_before_its_first_checkpoint_is_made_but_not_resumed(tmp_path):
    """Guards the row's ``resumed`` flag (its seconds are part of the row's): a start stopped before its first
    checkpoint leaves ``config.yaml`` and ``retrieval.json``, so its settings are checked, but the next run trains every
    step and its seconds are the whole row's (a kept row said ``resumed`` over all 24 steps); a committed checkpoint or
    an evaluation begun is resumed from, and an unfinished ``.tmp`` checkpoint is not."""
    from benchmarks.paper_table import progress
    from verl.utils import checkpoint

    run = tmp_path / "grpo_bm25" / "seed1"
    assert progress(run, "rl") == (False, False)
    run.mkdir(parents=True)
    (run / "settings.json").write_text("{}")
    assert progress(run, "rl") == (False, False)  # settings are written before anything is made
    (run / "config.yaml").write_text("trainer: {}\n")
    (run / "retrieval.json").write_text("{}")
    assert progress(run, "rl") == (True, False)
    tmp = checkpoint.begin(run, 4)  # killed while saving step 4
    assert progress(run, "rl") == (True, False)
    checkpoint.commit(run, tmp, 4, {"step": 4}, "trainer: {}\n")
    assert progress(run, "rl") == (True, True)

    rag = tmp_path / "rag"  # a baseline row: only its evaluation is resumed
    rag.mkdir()
    (rag / "settings.json").write_text("{}")
    assert progress(rag, "base") == (False, False)
    (rag / "eval").mkdir()
    assert progress(rag, "base") == (True, True)


def test_the_rows_made_from_the_cold_start_record_how_it_was_trained(tmp_path):
    """Guards against a table reusing a cold start (or a row trained or evaluated from one) made under another SFT
    schedule: demo-real's 6 steps left the model searching until max_turns on Wikipedia, one epoch answers. The SFT
    row and the Search-R1 rows record the cold start's schedule; Direct, RAG and R1 (from the model as it comes) do
    not, and a row made before the schedule was recorded is refused, naming it."""
    import argparse

    from benchmarks import paper_table

    args = argparse.Namespace(test_n=30, steps=4, val_n=12, val_points=2, engine="vllm",
                              data=paper_table.ROOT / paper_table.DATA, model=paper_table.ROOT / paper_table.MODEL)
    recorded = {name: "cold_start" in paper_table.row_settings(row, args) for name, row in paper_table.ROWS.items()}
    assert recorded == {"direct": False, "rag": False, "sft": True, "r1": False, "grpo_bm25": True,
                        "ppo_bm25": True, "grpo_dense": True, "ppo_dense": True, "grpo_bm25_nomask": True,
                        "grpo_bm25_turn": True, "grpo_bm25_ds": True, "sft_rephrase": True,
                        "grpo_bm25_rephrase": True, "sft_phrase": True, "grpo_bm25_phrase": True}
    assert paper_table.row_settings(paper_table.ROWS["sft"], args)["cold_start"] == {"sft_epochs": 1}
    # the rephrasing cold start is another one: its rows never reuse (nor are reused as) the plain cold start's
    assert paper_table.row_settings(paper_table.ROWS["grpo_bm25_rephrase"], args)["cold_start"] == {
        "sft_epochs": 1, "rephrase": 8}
    assert paper_table.row_settings(paper_table.ROWS["sft_phrase"], args)["cold_start"] == {
        "sft_epochs": 1, "rephrase": 8, "phrase_first": 0.5}
    before = {k: v for k, v in paper_table.row_settings(paper_table.ROWS["grpo_bm25"], args).items()
              if k != "cold_start"}
    with pytest.raises(SystemExit, match=r"other settings \(cold_start None there, \{'sft_epochs': 1\} now\)"):
        paper_table.check_settings(tmp_path / "settings.json", before,
                                   paper_table.row_settings(paper_table.ROWS["grpo_bm25"], args), "grpo_bm25", True)


def test_a_terminated_table_stops_its_trainer_and_services(tmp_path):
    """Guards against SIGTERM ending the table's process alone: its trainer went on training and its retrieval
    service kept its port, both orphaned (seen pausing a row at a checkpoint with ``kill``)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from benchmarks import paper_table

    pid_file, closed = tmp_path / "child.pid", tmp_path / "closed"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    script = (f"import sys; sys.path.insert(0, {str(paper_table.ROOT)!r})\n"
              "from contextlib import ExitStack\nfrom pathlib import Path\nfrom benchmarks import paper_table\n"
              "paper_table.exit_on_sigterm()\n"
              "with ExitStack() as stack:\n"
              f"    stack.callback(Path({str(closed)!r}).write_text, 'closed')\n"
              f"    paper_table.run([sys.executable, '-c', {child!r}], Path({str(tmp_path / 'child.log')!r}))\n")
    table = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    trainer = int(pid_file.read_text())
    table.send_signal(signal.SIGTERM)
    assert table.wait(timeout=60) == 128 + signal.SIGTERM
    assert closed.read_text() == "closed"  # the ExitStack (the retrieval services) was unwound
    with pytest.raises(ProcessLookupError):  # the child was stopped and reaped, not orphaned
        os.kill(trainer, 0)
