"""The cold start's scripted searcher and teacher (``python -m data_prep.cold_start scripted|teacher``) against the
real retrieval service on loopback. Scripted: one-hop questions answered after one search, a two-hop one through
its bridge entity, and questions it must drop (no gold answer in any passage; a prompt not made from the template),
with the summary line naming each; the SFT parquet it writes loads into the SFT trainer's dataset. Teacher: a real
(tiny) model behind an OpenAI-compatible chat server, its trajectories kept by exact match."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.sft_rows import rows_to_sft_parquet, sft_row
from data_prep.tiny_model import save_tiny_model, train_tokenizer
from retrieval_server.build_index import build_index
from retrieval_server.launcher import ServerProcess, free_port
from search_r1.llm_agent.formatting import information_block, policy_turn
from search_r1.reward.qa_em import em_check, extract_answer
from search_r1.search.client import RetrievalClient
from tests.entry_points import in_process
from verl.utils.sft_dataset import TrajectoryDataset

pytestmark = pytest.mark.slow  # the retrieval service runs in its own process

CORPUS = [("drunon", "Drunon", "The Drunon was built by Shothfus Company in 1714."),
          ("shothfus", "Shothfus Company", "Shothfus Company was founded by Dreinpei Firbam."),
          ("laemze", "Laemze", "Laemze was written by Brargrur Moulzel in 1687."),
          ("vuzaholm", "Vuzaholm", "Vuzaholm is a mountain village in Fuslith."),
          ("beislous", "Beislous", "The Beislous was built by Brede Foundry in 1666.")]
# (question, gold answers, what the scripted searcher should do)
QUESTIONS = [("Who wrote Laemze", ["Brargrur Moulzel", "Moulzel"], "one_search"),
             ("Who founded the organisation that built the Drunon", ["Dreinpei Firbam"], "two_searches"),
             ("Who built the Beislous", ["Brede Foundry"], "one_search"),
             ("Who founded the organisation that built the Beislous", ["Gorm Tallow"], "dropped")]


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("cold_start_kb")
    (root / "corpus.jsonl").write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n"
                                               for i, t, x in CORPUS))
    build_index(root / "corpus.jsonl", root / "index", retriever="bm25", progress=False)
    with ServerProcess(root / "index", root / "corpus.jsonl") as server:
        server.wait_ready()
        yield server.url


def test_scripted_searcher_keeps_grounded_trajectories_and_names_what_it_drops(service, tmp_path):
    """Guards against trajectories whose passages do not hold their answer (they teach guessing), a two-hop question
    that is never searched through its bridge, inserted blocks rendered otherwise than the loop renders them, and
    drops that go uncounted."""
    rows = [make_row("toy", q, golds, "train", i) for i, (q, golds, _) in enumerate(QUESTIONS)]
    rows.append({**make_row("toy", "Who wrote Laemze", ["Brargrur Moulzel"], "train", 9),
                 "prompt": [{"role": "user", "content": "a prompt of another template: Laemze?"}]})
    rows_to_parquet(rows, tmp_path / "qa.parquet")
    out = tmp_path / "sft.parquet"
    done = in_process("data_prep.cold_start", "scripted", "--data", tmp_path / "qa.parquet", "--retriever-url",
                      service, "--topk", "1", "--out", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"kept 3 of 5 (one_search: 2, two_searches: 1); dropped 2 (no gold answer in the "
                                   f"passages: 1, no question in prompt: 1) -> {out}")
    kept = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["index"] for r in kept] == [0, 1, 2]
    client = RetrievalClient(service, topk=1)
    for row, (question, golds, plan) in zip(kept, QUESTIONS, strict=False):
        turns = row["turns"]
        assert [t["sampled"] for t in turns] == [True, False] * (1 if plan == "one_search" else 2) + [True]
        response = "".join(t["text"] for t in turns)
        assert em_check(extract_answer(response), golds) == 1.0
        queries = [t["text"].split("<search>")[1].split("</search>")[0].strip() for t in turns if t["sampled"]
                   and "<search>" in t["text"]]
        assert queries[0] == question + "?"
        if plan == "two_searches":
            assert queries[1] == "Shothfus Company"  # the bridge entity named in the first passage
        for query, block in zip(queries, [t["text"] for t in turns if not t["sampled"]], strict=True):
            assert block == information_block(client.search([query])[0])
    tokenizer = train_tokenizer([x for _, _, x in CORPUS] * 3 + [q for q, _, _ in QUESTIONS] * 3, vocab_size=400)
    data = TrajectoryDataset(str(out), tokenizer, max_length=4096)
    assert len(data) == 3 and data.policy_tokens() > 0


def test_a_service_that_does_not_answer_is_named(tmp_path):
    """Guards against a traceback (or an empty file) when the retrieval service is not running."""
    rows_to_parquet([make_row("toy", "Who wrote Laemze", ["x"], "train", 0)], tmp_path / "qa.parquet")
    unused_url = f"http://127.0.0.1:{free_port()}"
    done = in_process("data_prep.cold_start", "scripted", "--data", tmp_path / "qa.parquet", "--retriever-url",
                      unused_url, "--out", tmp_path / "sft.parquet")
    assert done.returncode == 2 and unused_url in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not Path(tmp_path / "sft.parquet").exists()


# (question, what the teacher searches, gold answer): the teacher learnt to search and to answer the first two;
# the third question's gold answer is one it never gives
TEACHER_QA = [("Who wrote Laemze", "Laemze", "Brargrur Moulzel"),
              ("Who built the Beislous", "Beislous", "Brede Foundry"),
              ("Who built the Drunon", "Drunon", "Gorm Tallow")]
TEACHER_ANSWERS = ["Brargrur Moulzel", "Brede Foundry", "Shothfus Company"]


@pytest.fixture(scope="module")
def teacher_url(service, tmp_path_factory):
    """A tiny model taught (by the SFT trainer, in chat form: the passages come back as a user turn) to search each
    question and answer from the passages, served by ``transformers serve`` on loopback (OpenAI chat API)."""
    root = tmp_path_factory.mktemp("teacher")
    client = RetrievalClient(service, topk=1)
    rows, texts = [], []
    for i, ((question, query, _), answer) in enumerate(zip(TEACHER_QA, TEACHER_ANSWERS, strict=True)):
        qa = make_row("toy", question, [answer], "train", i)
        search, block = f"<search> {query} </search>", information_block(client.search([query])[0])
        chat = qa["prompt"] + [{"role": "assistant", "content": search}, {"role": "user", "content": block}]
        rows += [sft_row(qa, [policy_turn(search)]), sft_row({**qa, "prompt": chat}, [policy_turn(
            f"<answer> {answer} </answer>")])]
        texts += [qa["prompt"][0]["content"], search, block, answer]
    rows_to_sft_parquet(rows * 4, root / "sft.parquet")
    save_tiny_model(root / "model", texts * 4, vocab_size=500, hidden_size=64, num_heads=1)
    taught = in_process("verl.trainer.main_sft", f"model.partial_pretrain={root / 'model'}",
                        f"data.train_files={root / 'sft.parquet'}", f"trainer.default_local_dir={root / 'run'}",
                        "data.train_batch_size=8", "data.micro_batch_size_per_gpu=8", "optim.lr=3e-3",
                        "trainer.total_training_steps=80", "trainer.logger=[jsonl]", "trainer.device=cpu")
    assert taught.returncode == 0, taught.stderr[-2000:]
    port = free_port()
    serve = ("import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; "
             "sys.exit(main())")
    with (root / "serve.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-c", serve, "serve", str(root / "run" / "hf_model"), "--host",
                                 "127.0.0.1", "--port", str(port), "--device", "cpu"], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (root / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", str(root / "run" / "hf_model")
    finally:
        proc.terminate()
        proc.wait(60)


def test_teacher_trajectories_are_kept_by_exact_match(service, teacher_url, tmp_path):
    """Guards against keeping a teacher's trajectory whose answer is not a gold answer, against turns that are not the
    loop's layout (the teacher's text, then the passages of its search as the loop renders them, then its answer),
    over a real server's API (``transformers serve``, which keeps the stop string in the text; OpenAI's convention,
    which drops it, is ``test_teacher.py``'s)."""
    url, model = teacher_url
    rows_to_parquet([make_row("toy", q, [gold], "train", i) for i, (q, _, gold) in enumerate(TEACHER_QA)],
                    tmp_path / "qa.parquet")
    out = tmp_path / "teacher.parquet"
    done = in_process("data_prep.cold_start", "teacher", "--teacher-url", url, "--teacher-model", model, "--data",
                      tmp_path / "qa.parquet", "--retriever-url", service, "--topk", "1", "--out", out, "--n", "2",
                      "--temperature", "0", "--max-tokens", "24", "--concurrency", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"kept 2 of 6 (exact_match: 2); dropped 4 (duplicate: 2, wrong answer: 2) -> {out}"
    kept = pq.read_table(out).to_pylist()
    client = RetrievalClient(service, topk=1)
    for row, (_, query, gold) in zip(kept, TEACHER_QA, strict=False):
        assert row["turns"] == [{"text": f"<search> {query} </search>", "sampled": True},
                                {"text": information_block(client.search([query])[0]), "sampled": False},
                                {"text": f"<answer> {gold} </answer>", "sampled": True}]
