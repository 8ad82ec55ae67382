"""Entry point: ``python -m verl.trainer.main_ppo key=value ...``.

Builds the typed config (the flat YAML + overrides, validated once), the tokenizer, the rollout
engine, the search agent as the generation function and the exact-match reward, then calls
``PPOTrainer.fit()``. Nothing else happens here.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys

import numpy as np
import torch
from transformers import AutoTokenizer

from verl.config import Config, ConfigError, load_config, to_yaml
from verl.protocol import Batch
from verl.trainer.ppo_trainer import PPOTrainer
from verl.trainer.reward import RewardManager, load_custom_score_fn
from verl.workers.rollout import build_rollout

logger = logging.getLogger("verl.trainer.main_ppo")


def search_row_metrics(texts: list[str], batch: Batch) -> dict[str, np.ndarray]:
    """Validation metrics per row: exact match of the response's answer, searches and turns."""
    from search_r1.reward.qa_em import compute_score

    em = [compute_score(ds, text, gt, default_scorer="em") for ds, text, gt in
          zip(batch["data_source"], texts, batch["ground_truth"])]
    return {"em": np.array(em), "searches": np.asarray(batch["num_searches"], dtype=float),
            "turns": np.asarray(batch["num_turns"], dtype=float)}


def build_trainer(cfg: Config) -> PPOTrainer:
    from search_r1.llm_agent.generation import AgentConfig, LLMGenerationManager
    from search_r1.reward.qa_em import compute_score
    from search_r1.search.client import RetrievalClient

    torch.manual_seed(cfg.trainer.seed)
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path,
                                              trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    client = None
    if cfg.do_search:
        r = cfg.retriever
        client = RetrievalClient(r.url, r.topk, timeout=r.timeout, max_retries=r.max_retries)
        client.check_health(wait_s=10)
    engine = build_rollout(cfg)
    agent = LLMGenerationManager(tokenizer, engine, client, AgentConfig.from_config(cfg))
    custom = cfg.custom_reward_function
    score_fn = load_custom_score_fn(custom.path, custom.name) if custom.path else functools.partial(
        compute_score, default_scorer=cfg.reward.default_scorer, format_score=cfg.reward.format_score)
    return PPOTrainer(cfg, tokenizer, engine, agent, RewardManager(tokenizer, score_fn), search_row_metrics)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    logger.info("config:\n%s", to_yaml(cfg))
    trainer = build_trainer(cfg)
    final = trainer.fit()
    print(json.dumps({"initial_validation": trainer.initial_validation, "final_validation": final}, indent=1))
    for key in sorted(k for k in final if k.startswith(("val/em", "val/searches"))):
        if cfg.trainer.val_only:
            print(f"{key}: {final[key]:.3f}")
        else:
            print(f"{key}: before {trainer.initial_validation.get(key, float('nan')):.3f} -> after {final[key]:.3f}")
    print(f"metrics: {trainer.tracker.jsonl_path}  curves: {trainer.out_dir / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
