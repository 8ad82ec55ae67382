"""The cold start's scripted searcher and teacher (``python -m data_prep.cold_start scripted|teacher``) against the
real retrieval service on loopback. Scripted: one-hop questions answered after one search, a two-hop one through
its bridge entity, and questions it must drop (no gold answer in any passage; a prompt not made from the template),
with the summary line naming each; the SFT parquet it writes loads into the SFT trainer's dataset. Teacher: a real
(tiny) model behind an OpenAI-compatible chat server, its trajectories kept by exact match; in the hermes format, a
loopback server answering the scripted searcher's turns in both servers' conventions for tool calls (parsed into
``tool_calls``, or left in the text), whose kept rows must be the scripted searcher's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from data_prep.cold_start import HermesTurns, phrase_first_chosen, rephrasings, scripted_cold_start
from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.sft_rows import rows_to_sft_parquet, sft_row
from data_prep.tiny_model import save_tiny_model, train_tokenizer
from retrieval_server.index.build import build_index
from retrieval_server.launcher import ServerProcess, free_port
from search_r1.llm_agent.formatting import information_block, policy_turn
from search_r1.prompts import HERMES_TEMPLATE
from search_r1.reward.qa_em import em_check, extract_answer
from search_r1.search.client import RetrievalClient
from search_r1.tools import SEARCH_SCHEMA, format_hits
from tests.entry_points import in_process
from tests.search_r1.llm_agent.test_hermes import family_tokenizer
from verl.utils.sft_dataset import TrajectoryDataset

pytestmark = pytest.mark.slow  # the retrieval service runs in its own process

CORPUS = [("drunon", "Drunon", "The Drunon was built by Shothfus Company in 1714."),
          ("shothfus", "Shothfus Company", "Shothfus Company was founded by Dreinpei Firbam."),
          ("laemze", "Laemze", "Laemze was written by Brargrur Moulzel in 1687."),
          ("vuzaholm", "Vuzaholm", "Vuzaholm is a mountain village in Fuslith."),
          ("beislous", "Beislous", "The Beislous was built by Brede Foundry in 1666."),
          ("kelmor", "Kelmor", "Kelmor is a river port whose harbour master is Ulla Brenn.")]
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


# The question's own words find the Drunon's passage (five of them are there), not Kelmor's, and so do its first four
# runs of three content words; the fifth ("1714 harbour master") finds Kelmor's.
REPHRASED = ("when the drunon was built by shothfus company in 1714 who was the harbour master of kelmor",
             ["Ulla Brenn"])


def test_rephrasings_are_runs_of_the_question_s_content_words():
    """Guards against question or function words in a rephrased query and against runs out of the question's order."""
    assert rephrasings(REPHRASED[0], 7) == ["drunon built shothfus", "built shothfus company", "shothfus company 1714",
                                            "company 1714 harbour", "1714 harbour master", "harbour master kelmor",
                                            "drunon built"]
    assert rephrasings("Who wrote Laemze?", 9) == ["wrote laemze", "wrote", "laemze"]
    assert rephrasings("who is it", 3) == []


def test_a_failed_search_is_followed_by_a_phrase_of_the_question_that_finds_the_answer(service, tmp_path):
    """Guards against ``--rephrase`` keeping a second query whose passages do not hold the answer, against a question
    answered by its own passages searched twice, and against the default changing: without ``--rephrase`` the
    question is dropped, as before."""
    rows = [make_row("toy", REPHRASED[0], REPHRASED[1], "train", 0),
            make_row("toy", *QUESTIONS[0][:2], "train", 1), make_row("toy", *QUESTIONS[3][:2], "train", 2)]
    rows_to_parquet(rows, tmp_path / "qa.parquet")
    client = RetrievalClient(service, topk=1)
    assert "Ulla Brenn" not in client.search([REPHRASED[0]])[0][0]["contents"]
    _, counts = scripted_cold_start(str(tmp_path / "qa.parquet"), client.search)
    assert counts == {"one_search": 1, "no gold answer in the passages": 2}
    out = tmp_path / "sft.parquet"
    done = in_process("data_prep.cold_start", "scripted", "--data", tmp_path / "qa.parquet", "--retriever-url",
                      service, "--topk", "1", "--rephrase", "8", "--out", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"kept 2 of 3 (one_search: 1, rephrased: 1); dropped 1 (no gold answer in the "
                                   f"passages: 1) -> {out}")
    rephrased, one = pq.read_table(out).to_pylist()
    queries = [t["text"].split("<search>")[1].split("</search>")[0].strip() for t in rephrased["turns"]
               if "<search>" in t["text"]]
    assert queries == [REPHRASED[0] + "?", "1714 harbour master"]  # the first run whose passage holds the answer
    assert "I need to search for 1714 harbour master" in rephrased["turns"][2]["text"]
    assert rephrased["turns"][3]["text"] == information_block(client.search(["1714 harbour master"])[0])
    assert em_check(extract_answer("".join(t["text"] for t in rephrased["turns"])), REPHRASED[1]) == 1.0
    assert len(one["turns"]) == 3  # answered by the question's own passages: one search


def test_the_phrase_first_share_is_chosen_by_the_question_alone():
    """Guards against a share that is not that share of the questions, and against a choice drawn otherwise than
    from the question (a random draw, or the row's place): a larger share keeps the smaller's questions."""
    questions = [f"who was question number {i} about" for i in range(4000)]
    for share in (0.0, 0.3, 1.0):
        chosen = [q for q in questions if phrase_first_chosen(q, share)]
        assert abs(len(chosen) / len(questions) - share) < 0.03
    smaller, larger = ({q for q in questions if phrase_first_chosen(q, share)} for share in (0.3, 0.5))
    assert smaller < larger


# Its first phrase, "built beislous laemze", finds the Beislous's passage; the whole question finds Laemze's.
MISLEADING = ("Who built the Beislous that Laemze was written in 1687", ["Brargrur Moulzel"])


def test_phrase_first_searches_a_phrase_of_the_question_first_where_one_finds_the_answer(service, tmp_path):
    """Guards against ``--phrase-first`` keeping a phrase whose passages do not hold the answer (the first that does
    is kept, in ``rephrasings``' order), against a question with no such phrase being dropped when its own passages
    answer it, and against the option running without ``--rephrase`` (it would try no phrase) or taking a share
    outside 0-1."""
    rows = [make_row("toy", REPHRASED[0], REPHRASED[1], "train", 0),
            make_row("toy", *QUESTIONS[0][:2], "train", 1), make_row("toy", *QUESTIONS[3][:2], "train", 2)]
    rows_to_parquet(rows, tmp_path / "qa.parquet")
    client = RetrievalClient(service, topk=1)
    out = tmp_path / "sft.parquet"
    done = in_process("data_prep.cold_start", "scripted", "--data", tmp_path / "qa.parquet", "--retriever-url",
                      service, "--topk", "1", "--rephrase", "8", "--phrase-first", "1", "--out", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"kept 2 of 3 (phrase_first: 2); dropped 1 (no gold answer in the passages: 1) -> "
                                   f"{out}")
    kept = pq.read_table(out).to_pylist()
    searched = [[t["text"].split("<search>")[1].split("</search>")[0].strip() for t in row["turns"]
                 if "<search>" in t["text"]] for row in kept]
    # the Drunon question: its first four phrases find the Drunon's passage, the fifth Kelmor's; Laemze: its first
    assert searched == [["1714 harbour master"], ["wrote laemze"]]
    for row, queries, golds in zip(kept, searched, [REPHRASED[1], QUESTIONS[0][1]], strict=True):
        assert [t["sampled"] for t in row["turns"]] == [True, False, True]
        assert row["turns"][1]["text"] == information_block(client.search(queries)[0])
        assert em_check(extract_answer("".join(t["text"] for t in row["turns"])), golds) == 1.0
    rows_to_parquet([make_row("toy", *MISLEADING, "train", 0)], tmp_path / "misleading.parquet")
    assert "Brargrur" not in client.search(["built beislous laemze"])[0][0]["contents"]
    kept, counts = scripted_cold_start(str(tmp_path / "misleading.parquet"), client.search, max_rephrasings=1,
                                       phrase_first=1.0)
    assert counts == {"one_search": 1}
    assert "<search> " + MISLEADING[0] + "? </search>" in kept[0]["turns"][0]["text"]
    nobody = f"http://127.0.0.1:{free_port()}"  # both are refused before any service is asked
    for args, named in ((["--phrase-first", "0.5"], "give --rephrase N"), (["--phrase-first", "2", "--rephrase", "8"],
                                                                          "'2' is not a share from 0 to 1")):
        done = in_process("data_prep.cold_start", "scripted", "--data", tmp_path / "qa.parquet", "--retriever-url",
                          nobody, "--out", tmp_path / "no.parquet", *args)
        assert done.returncode == 2 and named in done.stderr, done.stderr
        assert not (tmp_path / "no.parquet").exists()


def test_the_scripted_searcher_needs_no_openai_package(service, tmp_path, monkeypatch):
    """Guards against the scripted mode importing the teacher's client: on a machine without the openai package
    (a GPU image, a minimal install) it failed with ModuleNotFoundError before writing anything."""
    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` now raises ImportError
    rows_to_parquet([make_row("toy", "Who wrote Laemze", ["Brargrur Moulzel"], "train", 0)], tmp_path / "qa.parquet")
    done = in_process("data_prep.cold_start", "scripted", "--data", tmp_path / "qa.parquet", "--retriever-url",
                      service, "--topk", "1", "--out", tmp_path / "sft.parquet")
    assert done.returncode == 0, done.stderr
    assert pq.read_table(tmp_path / "sft.parquet").num_rows == 1


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


class LoopbackTeacher:
    """An OpenAI-compatible chat server on loopback answering from a script: per question (the first user message)
    and turn (the assistant messages so far) one ``{"message", "finish_reason"}``; every request body is kept."""

    def __init__(self, script: dict[str, list[dict]]) -> None:
        self.script, self.requests = script, []
        teacher = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                teacher.requests.append(body)
                question = next(m["content"] for m in body["messages"] if m["role"] == "user")
                reply = teacher.script[question][sum(m["role"] == "assistant" for m in body["messages"])]
                data = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                                   "model": body["model"], "choices": [{
                                       "index": 0, "message": {"role": "assistant", **reply["message"]},
                                       "finish_reason": reply["finish_reason"]}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def server_reply(text: str, parses_calls: bool) -> dict:
    """What a server answers for a hermes policy turn ``text`` (Qwen's <|im_end|> ending a calling turn): the
    end-of-turn token stripped; with ``parses_calls`` (OpenAI, vLLM with a tool parser) the call as ``tool_calls`` and
    the stop string dropped, without (``transformers serve`` of a small model) both left in the content."""
    if text.endswith("</answer>"):
        return {"message": {"content": text.removesuffix("</answer>") if parses_calls else text},
                "finish_reason": "stop"}
    content = text.removesuffix("<|im_end|>")
    if not parses_calls:
        return {"message": {"content": content}, "finish_reason": "stop"}
    before, _, call = content.partition("<tool_call>")
    call = json.loads(call.removesuffix("</tool_call>"))
    return {"message": {"content": before, "tool_calls": [{"id": "srv-1", "type": "function", "function": {
        "name": call["name"], "arguments": json.dumps(call["arguments"])}}]}, "finish_reason": "tool_calls"}


def test_hermes_teacher_writes_the_scripted_hermes_layout_and_keeps_exact_matches(service, tmp_path):
    """Guards against a hermes teacher whose rows differ from what the hermes cold start writes (and RL produces) for
    the same turns (a call rendered otherwise, a missing end-of-turn token, tool messages inserted otherwise, a prompt
    without the tools), against losing calls a server returns as ``tool_calls`` or as text, and against keeping a
    wrong answer: the teacher writes the scripted searcher's turns, so its kept rows must equal the scripted ones and
    tokenise to the same masks; a malformed call gets the loop's error message; the teacher is offered the tool."""
    family_tokenizer("qwen").save_pretrained(tmp_path / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    qa = [make_row("toy", q, golds, "train", i, template=HERMES_TEMPLATE)
          for i, (q, golds, _) in enumerate(QUESTIONS[:3])]
    rows_to_parquet(qa, tmp_path / "qa.parquet")
    client = RetrievalClient(service, topk=1)
    scripted, counts = scripted_cold_start(str(tmp_path / "qa.parquet"), client.search, write=HermesTurns(tokenizer))
    assert [counts["one_search"], counts["two_searches"]] == [2, 1]
    script = {row["prompt"][-1]["content"]: [server_reply(t["text"], parses_calls=i == 0) for t in row["turns"]
                                             if t["sampled"]] for i, row in enumerate(scripted[:2])}
    beislous = qa[2]["prompt"][-1]["content"]  # an unknown tool and a search in one turn, then a wrong answer
    script[beislous] = [
        {"message": {"content": "<think> Two lookups. </think>", "tool_calls": [
            {"id": "srv-a", "type": "function", "function": {"name": "browse", "arguments": '{"url": "x"}'}},
            {"id": "srv-b", "type": "function", "function": {"name": "search", "arguments": '{"query": "Beislous"}'}}]},
         "finish_reason": "tool_calls"},
        {"message": {"content": "<answer> Gorm Tallow "}, "finish_reason": "stop"}]
    teacher = LoopbackTeacher(script)
    out = tmp_path / "teacher.parquet"
    try:
        done = in_process("data_prep.cold_start", "teacher", "--teacher-url", teacher.url, "--teacher-model", "t",
                          "--data", tmp_path / "qa.parquet", "--retriever-url", service, "--topk", "1", "--out", out,
                          "--n", "2", "--temperature", "0", "--concurrency", "2", "--format", "hermes",
                          "--tokenizer", tmp_path / "tokenizer")
    finally:
        teacher.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"kept 2 of 6 (exact_match: 2); dropped 4 (duplicate: 2, wrong answer: 2) -> {out}"
    rows_to_sft_parquet(scripted[:2], tmp_path / "scripted.parquet")
    assert pq.read_table(out).to_pylist() == pq.read_table(tmp_path / "scripted.parquet").to_pylist()
    batches = [TrajectoryDataset(str(path), tokenizer, max_length=4096).batch(range(2))
               for path in (out, tmp_path / "scripted.parquet")]
    for key in ("input_ids", "response_mask", "info_mask", "loss_mask"):
        assert torch.equal(batches[0][key], batches[1][key]), key

    assert all(r["tools"] == [SEARCH_SCHEMA] and r["stop"] == ["</answer>"] for r in teacher.requests)
    last = {}  # each question's longest chat
    for messages in sorted((r["messages"] for r in teacher.requests), key=len):
        last[messages[0]["content"]] = messages
    assert [(m["tool_call_id"], m["content"][:26]) for m in last[beislous][-2:]] == [
        ("srv-a", "Error: unknown tool 'brows"), ("srv-b", format_hits(client.search(["Beislous"])[0])[:26])]
    text_calls = last[qa[1]["prompt"][-1]["content"]]  # calls written as text: the content keeps them, ids given here
    assert "<tool_call>" in text_calls[1]["content"] and text_calls[2]["tool_call_id"] == "call_0"
