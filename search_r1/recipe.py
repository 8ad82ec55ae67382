"""The search recipe: the Search-R1 loop, the exact-match reward and the search metrics, plugged into
the generic trainer (``recipe: search_r1.recipe``, the config's default).

What the trainer reads of this module (``verl.trainer.recipe``): ``CONFIG_CLASS`` (the keys: the trainer's
plus ``retriever.*``, ``max_turns``, ``do_search``, ``reward.*``; ``search_r1.config``), ``DEFAULT_FORMAT`` (the
action format when ``multi_turn.format`` is null: Search-R1's tags), ``DEFAULT_TOOLS`` (the hermes format's tools
when ``multi_turn.tool_config_path`` is null: ``search``; ``search_r1.tools``), ``BASE_CONFIG`` (its documented
defaults, ``configs/ppo_trainer.yaml``), ``HELP`` and ``describe`` (the entry point's help and start-up lines),
``response_tokens`` (the start-up memory estimate's response length, from the blocks the service returns), ``alarms``
(the task's health alarms, ``search_r1.monitors``) and ``build_recipe``. Importing it registers the action formats
(``search_r1.llm_agent.tags`` and ``hermes``) and the reward terms (``search_r1.reward.terms``), so
``multi_turn.format`` and ``reward.terms`` are checked against them.
This project's setup.py registers this module as the installed recipe (entry point group ``verl.recipes``), which
makes it the default of the config key ``recipe``. Importing it is light (no torch, transformers or Ray: the
config, which imports this module first, refuses a bad key in about a second); the loop, the retrieval client and
the columns' checks are imported by the functions that use them.

``build_recipe`` is called by ``verl.trainer.ppo_trainer.PPOTrainer`` with the driver's generator
(the rollout engines of all actor ranks); the agent loop runs in the driver and sends one engine
call and one batched retrieval request per turn.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

from search_r1.config import SearchConfig
from search_r1.llm_agent import hermes, tags  # noqa: F401 -- register the action formats
from search_r1.reward.qa_em import compute_score, extract_answer
from search_r1.reward.terms import TermsReward
from search_r1.tools import DEFAULT_TOOLS  # noqa: F401 -- the tools of a hermes run without a tool config
from verl.config import DEFAULT_CONFIG, ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from search_r1.search.client import RetrievalClient
    from verl.protocol import Batch
    from verl.trainer.columns import Column
    from verl.trainer.recipe import Recipe
    from verl.workers.rollout.base import Generator


def search_columns() -> dict[str, Column]:
    """The search loop's own per-row columns of its generated batch (verl.agent.loop.AgentLoop.__call__: the loop's
    stop reason and turns, the search formats' searches and queries, search_env.SearchFormat.columns)."""
    from verl.trainer.columns import Column

    return {
        "stop_reason": Column("B", "why the trajectory ended (StopReason value: answered, max_turns, max_length, "
                                   "...)"),
        "num_turns": Column("B", "policy turns of the trajectory"),
        "num_searches": Column("B", "searches the trajectory made"),
        "queries": Column("B", "a list per row: the queries (hermes: tool calls) answered, in order"),
    }


CONFIG_CLASS = SearchConfig
DEFAULT_FORMAT = "search_r1"  # Search-R1's tags (search_r1.llm_agent.tags)
BASE_CONFIG = DEFAULT_CONFIG  # configs/ppo_trainer.yaml, generated from SearchConfig's declarations
HELP = """The search recipe (Search-R1; also: search-r1-train, bash train_ppo.sh, bash train_grpo.sh):
  data.train_files, data.val_files   parquet in the Search-R1 schema (python -m data_prep.qa_search)
  retriever.url                      the retrieval service (bash retrieval_launch.sh); required with search
  data.max_response_length, ...      lengths as Search-R1 means them (docs/design.md, Lengths)"""


def describe(cfg: SearchConfig) -> list[str]:
    """The start-up summary's line about the search (verl.trainer.main_ppo prints it)."""
    if cfg.retrieves:
        search = f"{cfg.retriever.url}, top-{cfg.retriever.topk}, up to {cfg.search_turns} search turns"
    elif cfg.do_search:
        search = "disabled (max_turns=0: one turn that answers; nothing retrieved or inserted)"
    else:
        search = "off (do_search=false: every search gets an empty block)"
    return [f"search   {search}"]


def search_row_metrics(texts: list[str], batch: Batch, normalize: str) -> dict[str, np.ndarray]:
    """Validation metrics per row: exact match of the response's answer (``normalize``: reward.normalize),
    searches and turns."""
    em = [compute_score(ds, text, gt, default_scorer="em", normalize=normalize) for ds, text, gt in
          zip(batch["data_source"], texts, batch["ground_truth"], strict=True)]
    return {"em": np.array(em), "searches": np.asarray(batch["num_searches"], dtype=float),
            "turns": np.asarray(batch["num_turns"], dtype=float)}


def search_trajectory_fields(batch: Batch) -> dict[str, list]:
    """The search's fields of each row's trajectory record (verl.utils.rollout_log): its queries in order and the
    answer the reward read (the last <answer> block, or None)."""
    return {"queries": [list(q) for q in batch["queries"]],
            "answer": [extract_answer(str(text)) for text in batch["response_text"]]}


def response_tokens(cfg: SearchConfig, tokenizer: PreTrainedTokenizerBase, questions: list[str]) -> tuple[int, str]:
    """The longest response a trajectory can have at the lengths the service really inserts, for the start-up
    memory estimate (``verl.trainer.recipe.expected_row_lengths``): ``max_turns`` turns that search and a final one,
    each sampling ``data.max_response_length`` tokens, and after each search the largest <information> block the
    service returns for ``questions`` (cut to ``data.max_obs_length``; an online engine is not asked, its requests
    are paid: ``data.max_obs_length``), or the invalid-action feedback where that is longer -> (tokens, where they
    come from). The policy's own turns are not known before it runs: at their budget."""
    from search_r1.llm_agent.formatting import INVALID_ACTION_FEEDBACK, observation_ids

    d = cfg.data
    docs, where = [[]], "empty blocks"  # do_search=false: every search gets an empty block (max_turns=0: none)
    if cfg.retrieves:
        client, health = connect_retriever(cfg)
        try:
            if health.get("retriever") == "online":  # each request to a web engine is paid: not probed
                docs, where = None, "an online engine's results, counted at data.max_obs_length"
            else:
                docs = client.search(questions)
                where = f"the service's passages for {len(questions)} training questions"
        finally:
            client.close()
    block = d.max_obs_length if docs is None else \
        max(len(ids) for ids, _ in observation_ids(tokenizer, docs, d.max_obs_length))
    inserted = max(block, len(tokenizer(INVALID_ACTION_FEEDBACK, add_special_tokens=False)["input_ids"]))
    return ((cfg.max_turns + 1) * d.max_response_length + cfg.max_turns * inserted,
            f"{cfg.max_turns + 1} turns of up to {d.max_response_length} sampled tokens and {cfg.max_turns} inserted "
            f"blocks of up to {inserted} tokens ({where})")


def connect_retriever(cfg: SearchConfig, wait_s: float = 10.0) -> tuple[RetrievalClient, dict]:
    """The client of ``retriever.url``, health-checked, and the service's ``/health`` answer. A service that does not
    answer stays ``RetrievalUnavailable`` (an environment that is down); endpoints that answer but cannot serve this
    run (a shard alone, shards of different corpora or builds, an endpoint that is not a retrieval service) are a
    ``ConfigError`` naming ``retriever.url``: the user's setting is wrong, and the trainer exits 2 with the message."""
    from search_r1.search.client import RetrievalClient, RetrievalError, RetrievalUnavailable

    client = RetrievalClient.from_config(cfg.retriever, cfg.trainer.ray_timeout_s)
    try:
        health = client.check_health(wait_s=wait_s)
    except RetrievalUnavailable:
        client.close()
        raise
    except RetrievalError as err:
        client.close()
        raise ConfigError(f"config key retriever.url is invalid: {err}") from None
    return client, health


def _data_sources(files: str) -> set[str]:
    """The data_source values of the training parquet files (the column alone is read)."""
    sources: set[str] = set()
    for name in (f.strip() for f in files.split(",") if f.strip()):
        if "data_source" in pq.read_schema(name).names:
            sources.update(pq.read_table(name, columns=["data_source"]).column(0).to_pylist())
    return sources or {"unknown"}


def check_retrieval_identity(cfg: SearchConfig, health: dict) -> None:
    """Record what the service serves in the run directory (checked against the record when resuming), and warn
    when it serves the demo's corpus for other data (search_r1/search/identity.py)."""
    from search_r1.search.identity import record_retrieval, warn_if_demo_corpus
    from verl.utils import checkpoint

    warn_if_demo_corpus(health, cfg.retriever.url, _data_sources(cfg.data.train_files))
    if cfg.trainer.val_only:
        return
    out = Path(cfg.trainer.default_local_dir)
    resuming = cfg.trainer.resume_mode != "disable" and checkpoint.find_latest(out) is not None
    record_retrieval(out, cfg.retriever.url, health, resuming)


def alarms(cfg: SearchConfig) -> list:
    """The search task's health alarms (``search_r1.monitors``: its text patterns and the score against the
    retrieval hits), which the trainer adds to its own (``verl.trainer.recipe.recipe_alarms``)."""
    from search_r1.monitors import alarms as search_alarms

    return search_alarms(cfg)


def build_recipe(cfg: SearchConfig, tokenizer: PreTrainedTokenizerBase, generator: Generator) -> Recipe:
    """The search agent as the generation function, exact match (``reward.*``, normalised by
    ``reward.normalize``) as the score."""
    from search_r1.llm_agent.generation import search_agent
    from verl.trainer.recipe import Recipe

    client = None
    if cfg.retrieves:
        client, health = connect_retriever(cfg)
        check_retrieval_identity(cfg, health)
    agent = search_agent(cfg, tokenizer, generator, client)
    score = functools.partial(compute_score, default_scorer=cfg.reward.default_scorer,
                              format_score=cfg.reward.format_score, normalize=cfg.reward.normalize)
    row_metrics = functools.partial(search_row_metrics, normalize=cfg.reward.normalize)
    terms = TermsReward(cfg.reward.terms, cfg.reward.turn_term, cfg.reward.normalize, cfg.reward.judge)
    return Recipe(generate=agent, score=score, row_metrics=row_metrics,
                  summary_prefixes=("val/em", "val/searches"), reward_details=terms, columns=search_columns(),
                  trajectory_fields=search_trajectory_fields)
