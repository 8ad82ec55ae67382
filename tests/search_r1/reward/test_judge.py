"""The ``judge`` reward term against a live OpenAI-compatible server: vLLM's, serving a tiny model built here, on CPU.

The tiny model is random, so what it judges is arbitrary; what is checked is the plumbing: the term asks the server
the prompt it documents, maps the constrained reply to 1 / 0 exactly as the server answered it, skips rows with no
answer, and fails with the URL named when the server is not there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from data_prep.tiny_model import save_tiny_model
from retrieval_server.launcher import free_port
from search_r1.config import JudgeConfig
from search_r1.reward.terms import JUDGE_PROMPT, TERMS, Context, Trajectory, Turn

pytestmark = pytest.mark.slow  # starts a vLLM server (about a minute on 2 cores)


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory):
    model = save_tiny_model(tmp_path_factory.mktemp("judge") / "model",
                            [JUDGE_PROMPT.format(question="q", golden="a", answer="b") + " yes no"] * 20,
                            vocab_size=300)
    port = free_port()
    log = tmp_path_factory.mktemp("judge_log") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                 "--served-model-name", "judge", "--host", "127.0.0.1", "--port", str(port),
                                 "--dtype", "float32", "--max-model-len", "512", "--gpu-memory-utilization", "0.1",
                                 "--enforce-eager"],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ,
                                                                         "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def _traj(answer: str | None, gold: str) -> Trajectory:
    text = f"<answer> {answer} </answer>" if answer is not None else "no answer"
    return Trajectory([Turn(text, "")], text, [gold], "nq", question=f"what is {gold}?")


def test_judge_scores_what_the_live_server_answers(judge_url):
    """Guards against a judge that does not ask the server, asks it something else, or maps its reply wrongly."""
    trajs = [_traj("Paris", "Paris"), _traj("Berlin", "Paris"), _traj(None, "Paris"), _traj("Nile river", "Nile")]
    cfg = JudgeConfig(url=judge_url, model="judge", timeout_s=120, max_concurrency=2)
    got = TERMS.get("judge")(trajs, Context(judge=cfg)).outcome.tolist()
    want = []
    for t in trajs:
        if t.answer is None:
            want.append(0.0)
            continue
        prompt = JUDGE_PROMPT.format(question=t.question, golden="; ".join(t.golden), answer=t.answer)
        reply = httpx.post(judge_url + "/v1/completions", timeout=120, json={
            "model": "judge", "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
            "structured_outputs": {"choice": [" yes", " no"]}}).json()["choices"][0]["text"].strip()
        assert reply in ("yes", "no")
        want.append(float(reply == "yes"))
    assert got == want


def test_judge_without_a_server_names_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=f"reward judge at {url}/v1/completions did not answer"):
        TERMS.get("judge")([_traj("Paris", "Paris")], Context(judge=JudgeConfig(url=url, model="m", timeout_s=5)))
