"""Issue 37's acceptance: Search-R1's train_ppo.sh / train_grpo.sh overrides on real-sized passages with a policy
that searches (docs/results.md, "Search-R1's overrides on real-sized passages").

    python benchmarks/search_r1_overrides_acceptance.py data WS            # corpus, dense MiniLM index, NQ parquet
    CORPUS=WS/corpus.jsonl INDEX_DIR=WS/e5_flat PORT=P bash retrieval_launch.sh &
    python benchmarks/search_r1_overrides_acceptance.py policy WS URL      # Qwen2.5-tokenizer policy, two searches
    WANDB_MODE=offline bash train_grpo.sh $(python benchmarks/search_r1_overrides_acceptance.py args grpo WS URL OUT)
    WANDB_MODE=offline bash train_ppo.sh $(python benchmarks/search_r1_overrides_acceptance.py args ppo WS URL OUT)

The passages and the policy come from the tests' helpers (``tests/search_r1/long_passages.py``,
``tests/search_r1/searching_policy.py``; run from the repository root with it on PYTHONPATH). The overrides are
Search-R1's, verbatim (``tests/verl/test_config_compat.py``), with the paths and sizes of a 2-core CPU appended.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from data_prep.qwen_tokenizer import build_qwen_tokenizer
from tests.search_r1.long_passages import write_corpus
from tests.search_r1.searching_policy import QUESTIONS, two_search_policy
from tests.verl.test_config_compat import search_r1_grpo, search_r1_ppo


def prepare_data(ws: Path) -> None:
    ws.mkdir(parents=True, exist_ok=True)
    write_corpus(ws / "corpus.jsonl")
    with (ws / "nq_train.jsonl").open("w") as f:  # FlashRAG's NQ format
        for i, (q, (_, a)) in enumerate(QUESTIONS.items()):
            f.write(json.dumps({"id": str(i), "question": q, "golden_answers": [a]}) + "\n")
    subprocess.run([sys.executable, "-m", "retrieval_server.build_index", "--corpus", str(ws / "corpus.jsonl"),
                    "--out", str(ws / "e5_flat"), "--retriever", "dense"], check=True)
    subprocess.run([sys.executable, "-m", "data_prep.qa_search", "--train", f"nq={ws / 'nq_train.jsonl'}",
                    "--test", f"nq={ws / 'nq_train.jsonl'}", "--out", str(ws / "nq_search")], check=True)


def overrides(script: str, ws: str, url: str, out: str) -> list[str]:
    make = search_r1_grpo if script == "grpo" else search_r1_ppo
    trajectories = 10 if script == "grpo" else 2  # 2 prompts x n_agent (5 for GRPO, 1 for PPO)
    sizes = ["data.train_batch_size=2", "data.val_batch_size=2",
             f"actor_rollout_ref.actor.ppo_mini_batch_size={trajectories}",
             "actor_rollout_ref.actor.ppo_micro_batch_size=1", "actor_rollout_ref.rollout.log_prob_micro_batch_size=2",
             "actor_rollout_ref.ref.log_prob_micro_batch_size=2", "critic.ppo_mini_batch_size=2",
             "critic.ppo_micro_batch_size=1", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
             f"retriever.url={url}/retrieve", f"trainer.default_local_dir={out}"]
    return make(f"{ws}/policy", f"{ws}/nq_search", f"{script}-acceptance") + sizes


def main(argv: list[str]) -> None:
    if argv[0] == "data":
        prepare_data(Path(argv[1]))
    elif argv[0] == "policy":
        _, inserted = two_search_policy(build_qwen_tokenizer(), Path(argv[1]) / "policy", argv[2])
        print("inserted tokens per memorised trajectory:", inserted)
    else:
        print(" ".join(shlex.quote(a) for a in overrides(*argv[1:5])))


if __name__ == "__main__":
    main(sys.argv[1:])
