"""The scripted cold start (``python -m data_prep.cold_start scripted``) against the real retrieval service on
loopback: one-hop questions answered after one search, a two-hop one through its bridge entity, and questions it
must drop (no gold answer in any passage; a prompt not made from the template), with the summary line naming each;
the SFT parquet it writes loads into the SFT trainer's dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import train_tokenizer
from retrieval_server.build_index import build_index
from retrieval_server.launcher import ServerProcess, free_port
from search_r1.llm_agent.formatting import information_block
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
