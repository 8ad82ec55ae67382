"""The search loop with a real engine (transformers) and a tiny real policy that memorised two trajectories
(``tests/search_r1/memorised_policy.py``; the tiny-vocabulary one is the ``policy`` fixture)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import ray

from search_r1.llm_agent.generation import StopReason
from search_r1.search.client import RetrievalClient
from tests.search_r1.agent_settings import make_agent, search_config
from tests.search_r1.memorised_policy import QUESTIONS, TOPK, memorised_policy
from verl.config import DEMO_CONFIG, load_config
from verl.single_controller import create_worker_group
from verl.single_controller.rollout import GroupRollout
from verl.workers.actor_rollout import ActorRolloutWorker
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

# slow: starts trainers, services or engines (not in `make test-fast`); one thread: memorising with a 151k-row LM
# head was ~3x faster than with two on the shared 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def qwen_policy(tmp_path_factory, service_url, qwen_tokenizer):
    """The memorising policy on Qwen2.5's real vocabulary (151,665 ids; ``</search>`` is three tokens)."""
    return memorised_policy(qwen_tokenizer, tmp_path_factory.mktemp("qwen_policy"), service_url)


@pytest.mark.parametrize("mode, chunk", [("sync", 0), ("async", 0), ("async", 4)])
@pytest.mark.parametrize("which", ["policy", "qwen_policy"])
def test_hf_engine_reproduces_the_memorised_search_trajectories(request, which, mode, chunk, service_url):
    """Guards against loop/engine mismatches a scripted engine cannot show (real stop strings, left padding,
    multi-turn continuation of the exact context): greedy rollouts must equal the memorised ids token for token,
    also where the stop strings span several tokens of a real vocabulary, in both schedules; with 4-token chunks
    (async) a turn is continued over several engine calls and ``</search>`` (three Qwen tokens) spans two of them."""
    model_dir, tokenizer, prompts, responses, masks = request.getfixturevalue(which)
    engine = HFRollout(str(model_dir), dtype="float32", device="cpu", micro_batch_size=64, seed=0)
    cfg = search_config(max_turns=3, max_start_length=256, max_prompt_length=576, max_response_length=320,
                        max_trajectory_length=320,
                        max_obs_length=96, do_search=True, topk=TOPK, mode=mode, chunk_tokens=chunk)
    agent = make_agent(tokenizer, engine, RetrievalClient(service_url, TOPK), cfg)
    result = agent.run(prompts, SamplingParams(max_tokens=1, temperature=0.0))
    for traj, response, mask in zip(result.trajectories, responses, masks, strict=True):
        assert traj.response_ids == response
        assert traj.info_mask == mask
        assert traj.stop_reason is StopReason.ANSWERED and traj.num_searches == 1 and traj.num_turns == 2


@pytest.fixture(scope="module")
def two_rank_group(policy, ray_address):
    """One HF engine on each of 2 Ray worker ranks (FSDP2 actors over gloo) serving the memorised policy, on the
    session's Ray instance; started once for both schedules (the worker processes are the slow part)."""
    model_dir, *_ = policy
    cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=hf",
                       "trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.device=cpu"], [DEMO_CONFIG])
    ray.init(address=ray_address)  # ray.shutdown() below only disconnects
    group = create_worker_group(ActorRolloutWorker, cfg, "ray", 2, total_steps=1)
    try:
        yield group
    finally:
        group.shutdown()
        ray.shutdown()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_search_loop_through_a_two_rank_group(policy, service_url, two_rank_group, mode):
    """Guards against the loop breaking when its engine calls are spread over ranks (rows returned out of
    order, a rank's share lost, inserted blocks attached to the wrong row): the same loop, with one HF
    engine on each of 2 Ray worker ranks (FSDP2 actors over gloo), must reproduce the memorised
    trajectories token for token, with both engines generating."""
    model_dir, tokenizer, prompts, responses, masks = policy
    rollout = GroupRollout(two_rank_group, tensor_parallel_size=1)
    agent_cfg = search_config(max_turns=3, max_start_length=256, max_prompt_length=576, max_response_length=320,
                              max_trajectory_length=320, max_obs_length=96, do_search=True, topk=TOPK, mode=mode)
    agent = make_agent(tokenizer, rollout, RetrievalClient(service_url, TOPK), agent_cfg)
    order = [1, 0, 1]  # 3 rows over 2 ranks
    result = agent.run([prompts[i] for i in order], SamplingParams(max_tokens=1, temperature=0.0))
    metrics = rollout.take_metrics()
    assert metrics["perf/rollout_ranks"] == 2.0 and 0.0 <= metrics["perf/rollout_idle_frac"] < 1.0
    for traj, i in zip(result.trajectories, order, strict=True):
        assert traj.response_ids == responses[i]
        assert traj.info_mask == masks[i]
        assert traj.stop_reason is StopReason.ANSWERED and traj.num_searches == 1 and traj.num_turns == 2


def test_infer_cli_prints_the_trajectory(policy, service_url):
    """Guards against the inference CLI running a different loop or prompt than training, or hiding inserted text."""
    model_dir, *_ = policy
    question = next(iter(QUESTIONS))
    done = subprocess.run([sys.executable, "-m", "search_r1.infer", "--model", str(model_dir), "--question", question,
                           "--retriever-url", service_url, "--topk", str(TOPK), "--engine", "hf", "--temperature", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[[inserted by the environment >>>" in done.stdout and "<information>Doc 1(Title: Paris)" in done.stdout
    assert "stop: answered" in done.stdout and "answer: 'Paris'" in done.stdout


def test_infer_cli_names_the_url_when_the_service_is_down(policy, unused_url):
    """Guards against inference hanging or failing obscurely when the retrieval service is not running."""
    model_dir, *_ = policy
    url = unused_url
    done = subprocess.run([sys.executable, "-m", "search_r1.infer", "--model", str(model_dir), "--question", "x",
                           "--retriever-url", url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2  # a wrong or unstarted --retriever-url: an input error, as in evaluate and training
    assert url in done.stderr and "retrieval_launch.sh" in done.stderr and "Traceback" not in done.stderr


def test_vllm_engine_continuous_batching_reproduces_the_memorised_search_trajectories(policy, service_url):
    """The asynchronous loop over vLLM's continuous batching (requests added to the running batch as their
    trajectories arrive): greedy rollouts equal the memorised ids, as the lockstep loop's do."""
    pytest.importorskip("vllm")
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    model_dir, tokenizer, prompts, responses, masks = policy
    engine = VLLMRollout(str(model_dir), max_model_len=512, cpu_kv_cache_gb=0.25)
    for mode in ("sync", "async"):
        cfg = search_config(max_turns=3, max_start_length=256, max_prompt_length=576, max_response_length=320,
                      max_trajectory_length=320,
                            max_obs_length=96, do_search=True, topk=TOPK, mode=mode)
        agent = make_agent(tokenizer, engine, RetrievalClient(service_url, TOPK), cfg)
        result = agent.run(prompts * 3, SamplingParams(max_tokens=1, temperature=0.0))
        for traj, response, mask in zip(result.trajectories, responses * 3, masks * 3, strict=True):
            assert traj.response_ids == response and traj.info_mask == mask, mode
        if mode == "async":
            assert result.schedule["perf/engine_calls"] >= 2
