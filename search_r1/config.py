"""The search recipe's config: the trainer's sections (``verl.config.Config``) plus the search task's own.

``SearchConfig`` adds the retrieval service (``retriever.*``), the loop's turns (``max_turns``, ``do_search``) and
the reward (``reward.*``), at the top level where Search-R1's scripts put them. ``search_r1.recipe`` declares it
as its ``CONFIG_CLASS``, with ``configs/ppo_trainer.yaml`` (generated from these declarations by
``python -m verl.config.doc``) as its ``BASE_CONFIG``. Each setting is declared once
(``verl.config.setting``); the allowed scorers, normalisations and reward terms are read from the
registries that define them (``search_r1.reward.qa_em.SCORERS`` and ``NORMALIZERS``, the reward-term registry
``search_r1.reward.terms.TERMS``, filled by that module and any plug-in). The recipe's own defaults of trainer keys
are declared here too (``trainer.project_name``: ``search_r1``, which names the run directory).

Choices:
- **The retriever URL list is parsed whole** (``check_retriever_url``): every comma-separated entry must be
  ``http(s)://HOST[:PORT][/PATH]`` or ``ray://NAME``; a ``;`` (or any other separator), a bad port, a query
  string or an empty host is named with the entry, before the client ever sends a request. Search-R1 names the
  endpoint (``.../retrieve``); the config keeps the base URL (``RetrieverConfig.__post_init__``).
- ``retriever.url`` is required only when a run retrieves (``do_search=true`` and ``max_turns`` >= 1,
  ``SearchConfig.retrieves``; ``check_paths``): configs with no service (search disabled, tests) still load; there
  is no default address, so a run never searches another user's service by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from search_r1.reward.qa_em import NORMALIZERS, SCORERS
from search_r1.reward.terms import TERMS
from verl.config import Config, TrainerConfig, require, section, setting
from verl.errors import ConfigError
from verl.tools import run_tool_specs


def term_names() -> tuple[str, ...]:
    """The reward terms registered: the search recipe's (``search_r1.reward.terms``) and any plug-in's."""
    return TERMS.names()


def _base_urls(url: str) -> str:
    """Each comma-separated endpoint of ``url`` without a trailing ``/retrieve`` (Search-R1 names the endpoint)."""
    def base(entry: str) -> str:
        entry = entry.strip().rstrip("/")
        return entry.removesuffix("/retrieve")
    return ",".join(base(entry) for entry in url.split(",")) if "/retrieve" in url else url


@dataclass
class RetrieverConfig:
    url: str | None = setting(
        None, "Base URL of the retrieval service; the loop POSTs to <url>/retrieve (Search-R1's endpoint URL is "
        "accepted too). Several, comma-separated in the one string (http://h1:8001,http://h2:8001): the shards of a "
        "sharded index and their replicas, grouped by what each one's /health says. ray://NAME: the replicas of the "
        "Ray deployment NAME (python -m retrieval_server.ray_service up --name NAME ...), looked up on the cluster "
        "(RAY_ADDRESS) and again after a restart. Required with do_search=true (no default: configs/demo.yaml names "
        "the demo's http://127.0.0.1:8000). What the service serves (/health: corpus sha256, retriever, index, "
        "encoder, recall) is written to the run directory's retrieval.json at start and must be the same corpus when "
        "the run is resumed.", steers=True)
    topk: int = setting(3, "Passages returned per search.", low=1)
    timeout: float = setting(30.0, "Seconds before one retrieval request is abandoned and retried.", low=0,
                             low_open=True, what="seconds", steers=True)
    outage_timeout_s: float = setting(
        300.0, "Seconds a request keeps being retried (connection errors, timeouts, 5xx) with exponential backoff "
        "(0.5 s doubling, at most 8 s per wait, each wait logged) before the service counts as down: training then "
        "saves a checkpoint of the last finished step and stops (exit status 3).", low=0, low_open=True,
        what="seconds", steers=True)
    replica_timeout_s: float = setting(
        10.0, "Several endpoints in url (comma-separated shards and replicas): seconds before a request to one "
        "replica is abandoned and sent to another replica of its shard (the last replica left waits the full "
        "timeout). At most retriever.timeout.", low=0, low_open=True, what="seconds", steers=True)
    replica_cooldown_s: float = setting(
        30.0, "Several endpoints in url: seconds a replica that failed (connection error, timeout, 5xx) is skipped.",
        low=0, low_open=True, what="seconds", steers=True)
    coalesce_ms: float = setting(
        5.0, "rollout.mode=async: searches that arrive within this many ms of the first waiting one go out as one "
        "request, so the service still sees batches (sync mode sends one request per turn).", low=0)
    coalesce_max: int = setting(512, "rollout.mode=async: most queries in one coalesced request.", low=1)
    max_inflight: int = setting(4, "rollout.mode=async: retrieval requests in flight at once.", low=1)

    def __post_init__(self) -> None:
        if isinstance(self.url, str):
            self.url = _base_urls(self.url)


@dataclass
class JudgeConfig:
    url: str | None = setting(
        None, "Base URL of an OpenAI-compatible server (python -m vllm.entrypoints.openai.api_server ...) for the "
        "judge term.")
    model: str | None = setting(None, "Model name the server serves (its --served-model-name or model path).")
    timeout_s: float = setting(60.0, "Seconds per judge request.", low=0, low_open=True, what="seconds")
    max_concurrency: int = setting(8, "Judge requests in flight at once.")


@dataclass
class RewardConfig:
    default_scorer: str = setting(
        "em", "Scorer when a row's data_source has no specific one (search_r1.reward.qa_em.SCORERS): {choices}.",
        choices=lambda: tuple(SCORERS))
    format_score: float = setting(
        0.0, "Reward added for a well-formed trajectory (tags balanced, ends in <answer>), even if wrong.")
    normalize: str = setting(
        "squad", "Answer normalisation before EM / sub-EM / F1: squad = SQuAD's recipe over ASCII punctuation, as "
        "Search-R1, FlashRAG and published tables score | unicode = NFKC, Unicode punctuation removed too.",
        choices=lambda: tuple(NORMALIZERS))
    terms: dict[str, float] | None = setting(
        None, "Composable reward: {term: weight, ...} over the registered terms ({choices}); the reward is the "
        "weighted sum of the terms. The recipe's (search_r1.reward.terms): em | subem | f1 | format | retrieval_hit "
        "(a search retrieved a passage containing a gold answer) | grounding (the answer occurs in a retrieved "
        "passage) | judge (a model behind reward.judge.url says the answer matches). null = Search-R1's reward "
        "(default_scorer + format_score). Every term but judge is logged as reward/<term>.", choices=term_names,
        low=0, null_means="Search-R1's reward")
    turn_term: str | None = setting(
        None, "The term whose per-turn scores give turn-level credit (algorithm.turn_reward_coef, "
        "adv_estimator=grpo_turn): retrieval_hit | null.", choices=term_names)
    judge: JudgeConfig = section(JudgeConfig)


@dataclass
class MonitorsConfig:
    repetition_above: float = setting(
        0.2, "Health alarm repeated_ngrams: share of a step's trajectories with a policy turn whose word 4-grams "
        "mostly repeat (monitor/repeated_ngrams) above this.", low=0, high=1, what="a share of the trajectories",
        steers=True)
    think_above: float = setting(
        0.2, "Health alarm think_empty_or_copied: share with a <think> block that is empty or is the question, above "
        "this.", low=0, high=1, what="a share of the trajectories",
        steers=True)
    hedge_above: float = setting(
        0.1, "Health alarm hedged_answers: share whose answer lists candidates (A or B; A/B; A, B, C), above this.",
        low=0, high=1, what="a share of the trajectories", steers=True)
    copy_above: float = setting(
        0.1, "Health alarm copied_answers: share whose answer copies the question or a whole passage, above this.",
        low=0, high=1, what="a share of the trajectories", steers=True)
    repeated_queries_above: float = setting(
        0.2, "Health alarm repeated_queries: share that send the same query twice, above this.", low=0, high=1,
        what="a share of the trajectories", steers=True)


@dataclass
class SearchConfig(Config):
    """The one flat config of the trainer with the search recipe. Every key is documented above its line.
    Generated from the declarations (verl/config/sections.py, verl/config/algorithm.py, search_r1/config.py) by
    `make docs`: edit those.
    Override any key on the command line in OmegaConf dotlist style:
      python -m verl.trainer.main_ppo data.train_batch_size=64 algorithm.adv_estimator=grpo
    Paths are relative to the directory you launch from. Unknown keys are errors naming the key.
    Key names are verl's; Search-R1's spellings (optim.lr, n_agent, global micro-batch sizes, +key=value, ...) are
    accepted too (verl/config/compat.py, docs/config.md).
    The values below are defaults for real data (Search-R1's published lengths and learning rates); the embedded
    demo (tiny policy, demo knowledge base, 2-core CPU) layers configs/demo.yaml on top (`--config configs/demo.yaml`).
    """

    retriever: RetrieverConfig = section(
        RetrieverConfig, "URL and results per query of the retrieval service (see retrieval_launch.sh).")
    max_turns: int = setting(
        2, "Maximum search turns per trajectory; after the last one a final answer turn without search is forced. "
        "0 = search disabled (R1 without search, and the Direct and RAG baselines): the policy answers in its one "
        "turn, nothing is retrieved or inserted, no retrieval service is needed; give it a prompt that offers no "
        "search (search_r1.prompts.NO_SEARCH_TEMPLATE).", low=0)
    do_search: bool = setting(
        True, "Call the retrieval service on <search>; false = every search gets an empty <information> block.")
    reward: RewardConfig = section(RewardConfig)
    monitors: MonitorsConfig = section(
        MonitorsConfig, "The search task's health alarms (search_r1/monitors.py): the share of a step's trajectories "
        "whose text shows a pattern (logged as monitor/<name>) that fires the alarm when its mean over the last "
        "trainer.alarm_window steps is above it. trainer.stop_on may name them.")
    trainer: TrainerConfig = section(TrainerConfig, project_name="search_r1")

    @property
    def search_turns(self) -> int:
        """The turns that may search: ``max_turns``, or ``multi_turn.max_assistant_turns - 1`` when that is set."""
        assistant_turns = self.actor_rollout_ref.rollout.multi_turn.max_assistant_turns
        return self.max_turns if assistant_turns is None else assistant_turns - 1

    @property
    def retrieves(self) -> bool:
        """The loop calls the retrieval service: ``do_search`` and at least one search turn (``max_turns=0`` is
        search disabled: no client, no request, nothing inserted)."""
        return self.do_search and self.search_turns > 0

    def check(self) -> None:
        super().check()
        if self.retriever.url is not None:
            check_retriever_url(self.retriever.url)
        r = self.retriever
        require(r.replica_timeout_s <= r.timeout, "retriever.replica_timeout_s", r.replica_timeout_s,
                f"at most retriever.timeout={r.timeout:g}")
        check_reward_terms(self.reward)

    def check_paths(self) -> None:
        super().check_paths()
        run_tool_specs(self)  # a tool-calling format's tool config: readable, well formed, its classes known
        if self.retrieves and self.retriever.url is None:
            raise ConfigError("config key retriever.url is not set: name your retrieval service (e.g. "
                              "retriever.url=http://127.0.0.1:8000; retrieval_launch.sh serves on its PORT), required "
                              "with do_search=true; there is no default, so a run never searches another user's "
                              "service by accident (the embedded demo sets it with --config configs/demo.yaml)")


def check_reward_terms(r: RewardConfig) -> None:
    """reward.terms has at least one term (names and weights are their declaration's); the judge term needs its
    server."""
    if r.terms is None:
        return
    require(len(r.terms) > 0, "reward.terms", r.terms, "null (Search-R1's reward) or at least one term")
    require("judge" not in r.terms or bool(r.judge.url), "reward.judge.url", r.judge.url,
            "the URL of an OpenAI-compatible server (e.g. vLLM's: http://HOST:PORT) when reward.terms has judge")


def url_problem(entry: str) -> str | None:
    """Why ``entry`` (one endpoint of ``retriever.url``) is not ``http(s)://HOST[:PORT][/PATH]`` or ``ray://NAME``;
    None when it is."""
    if any(c in entry for c in ";| \t\n"):
        return "separate endpoints with commas (no ';', '|' or spaces)"
    if entry.startswith("ray://"):
        name = entry[len("ray://"):].rstrip("/")
        return None if name and "/" not in name and ":" not in name else "ray://NAME names a deployment: one word"
    try:
        parts = urlsplit(entry)
        port = parts.port
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http://, https:// or ray://"
    if not parts.hostname:
        return "no host"
    if parts.query or parts.fragment:
        return "a base URL takes no ?query or #fragment"
    if port == 0:
        return "port 0 is not a port a service listens on"
    return None


def check_retriever_url(url: str) -> None:
    """``retriever.url``: one or more comma-separated endpoints, each well formed (``url_problem``)."""
    entries = [part.strip() for part in url.split(",")]
    allowed = ("an http:// or https:// URL of the retrieval service, e.g. http://127.0.0.1:8000, several (shards, "
               "replicas) separated by commas, or ray://NAME for the deployment NAME started by python -m "
               "retrieval_server.ray_service up")
    if not any(entries):
        raise ConfigError(f"config key retriever.url={url!r} is invalid: allowed {allowed}")
    for entry in entries:
        problem = "an empty entry between commas" if not entry else url_problem(entry)
        if problem:
            raise ConfigError(f"config key retriever.url={url!r} is invalid: {entry!r}: {problem}; allowed {allowed}")
