"""The README's "Running on your data" steps, as a user types them, on data in the public formats that is not ours.

Guards against the demo path working while the user's path does not: a launcher that quietly served the demo
corpus to a user's questions and exited 0, a retrieval launcher that built a new index over a mistyped INDEX_DIR,
a data-prep command that does not read FlashRAG's JSONL. The corpus is written here in the format of Search-R1's
`example/corpus.jsonl` (`{"id": "0", "contents": "\\"Title\\"\\nTitle text ..."}`) and the questions in FlashRAG's
NQ format (`{"id": "train_0", "question": ..., "golden_answers": [...]}`); the policy is a tiny model built here.
Every command runs from the repository root through the project's scripts and modules, and each exit status is
checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from data_prep.tiny_model import save_tiny_model
from retrieval_server.launcher import ServerProcess, free_port
from search_r1.prompts import make_prompt

pytestmark = pytest.mark.slow  # starts trainers, services or engines: not in `make test-fast`

ROOT = Path(__file__).resolve().parents[1]
FACTS = [  # (title, text, question, answer): fictional, so no model could know them
    ("Orla Venn", "Orla Venn (born 1931) was a cartographer who drew the first survey of the Kessit Delta.",
     "who drew the first survey of the kessit delta", "Orla Venn"),
    ("Kessit Delta", "The Kessit Delta lies at the mouth of the river Amaro, south of the town of Lune.",
     "which river flows into the kessit delta", "Amaro"),
    ("Lune (town)", "Lune is a fishing town founded in 1702 by settlers from Varn.",
     "in what year was the town of lune founded", "1702"),
    ("Varn", "Varn is an island whose capital is Pelleck.", "what is the capital of varn", "Pelleck"),
    ("Tobias Grell", "Tobias Grell composed the opera The Salt Lantern in 1888.",
     "who composed the salt lantern", "Tobias Grell"),
    ("The Salt Lantern", "The Salt Lantern premiered at the Odeon of Pelleck.",
     "where did the salt lantern premiere", "the Odeon of Pelleck"),
]


def sh(cmd: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_readme_real_data_steps(tmp_path):
    py = sys.executable
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{title}"\n{title} {text}'}) + "\n"
                              for i, (title, text, _, _) in enumerate(FACTS)))
    (tmp_path / "nq").mkdir()
    for split in ("train", "test"):
        (tmp_path / "nq" / f"{split}.jsonl").write_text("".join(
            json.dumps({"id": f"{split}_{i}", "question": q, "golden_answers": [a]}) + "\n"
            for i, (_, _, q, a) in enumerate(FACTS)))
    save_tiny_model(tmp_path / "model", [make_prompt(q) for _, _, q, _ in FACTS] * 4, vocab_size=600)

    # 1. index, then the service (a mistyped INDEX_DIR is refused first, building nothing)
    sh(f"{py} -m retrieval_server.build_index --corpus {corpus} --out {tmp_path}/indexes/bm25 --retriever bm25")
    port = free_port()
    typo = subprocess.run(["bash", "retrieval_launch.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": py, "CORPUS": str(corpus), "PORT": str(port),
                               "INDEX_DIR": f"{tmp_path}/indexes/bm52"})
    assert typo.returncode == 2 and "bm52 has no manifest.json" in typo.stderr
    assert not (tmp_path / "indexes" / "bm52").exists()
    env = {**os.environ, "PYTHON": py, "CORPUS": str(corpus), "INDEX_DIR": f"{tmp_path}/indexes/bm25",
           "PORT": str(port)}
    with ServerProcess(command=["bash", "retrieval_launch.sh"], port=port, cwd=ROOT, env=env) as service:
        service.wait_ready()
        url = service.url
        top = httpx.post(f"{url}/retrieve", json={"queries": ["capital of Varn"], "topk": 1}).json()["result"][0][0]
        assert "Pelleck" in top["contents"]

        # 2. QA data
        out = sh(f"{py} -m data_prep.qa_search --train nq={tmp_path}/nq/train.jsonl "
                 f"--test nq={tmp_path}/nq/test.jsonl --out {tmp_path}/data/nq").stdout
        assert f"train: {len(FACTS)} rows" in out

        # 3. train (sizes for two CPU cores), 4. outputs
        run_dir = tmp_path / "outputs" / "run"
        train = sh(f"bash train_ppo.sh data.train_files={tmp_path}/data/nq/train.parquet "
                   f"data.val_files={tmp_path}/data/nq/test.parquet actor_rollout_ref.model.path={tmp_path}/model "
                   f"retriever.url={url} data.train_batch_size=6 actor_rollout_ref.actor.ppo_mini_batch_size=6 "
                   "critic.ppo_mini_batch_size=6 data.max_trajectory_length=48 trainer.total_training_steps=2 "
                   f"trainer.save_freq=1 trainer.default_local_dir={run_dir}", PYTHON=py)
        assert "demo" not in train.stdout.lower() and "starting" not in train.stdout  # nothing of the demo's
        assert all((run_dir / name).exists() for name in ("config.yaml", "metrics.jsonl", "global_step_2",
                                                           "hf_model/config.json"))
        assert "val/em: before" in train.stdout

        # 5. evaluate
        sh(f"{py} -m search_r1.evaluate --model {run_dir}/hf_model --data {tmp_path}/data/nq/test.parquet "
           f"--retriever-url {url} --out {tmp_path}/eval/nq data.max_trajectory_length=48")
        report = json.loads((tmp_path / "eval" / "nq" / "results.json").read_text())
        assert report["by_source"]["nq"]["n"] == len(FACTS)
