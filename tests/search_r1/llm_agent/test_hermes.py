"""The hermes action format (``search_r1/llm_agent/hermes.py``): tool calls parsed from ``<tool_call>`` JSON, results
appended as tool messages through the chat template, token-in/token-out, the tokenisation sanity check, masks equal
to the tag format's, and the ``open`` tool over the service's ``POST /doc``.

The tokenizers are built here in two families' shapes (``tests/search_r1/model_families.py``): a Qwen2.5-style one
whose template shows tools itself (written here after Qwen2.5's: tools in the system message, tool results as
``<tool_response>`` blocks in a user turn) and a Llama-3-style one whose template knows no tools (the loop puts the
schemas into the system message, Hermes' convention). The engine is the scripted one of ``conftest.py``; the
retrieval service is the real one on loopback (``tests/search_r1/conftest.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import re

import httpx
import pytest

from search_r1.llm_agent.generation import StopReason
from search_r1.llm_agent.hermes import ChatFormat, HermesFormat, ToolCall, check_calls, parse_tool_calls
from search_r1.prompts import HERMES_TEMPLATE, make_prompt
from search_r1.search.client import RetrievalClient
from search_r1.tools import OPEN_SCHEMA, SEARCH_SCHEMA, ToolEnv
from tests.search_r1.agent_settings import make_agent, search_config
from tests.search_r1.llm_agent.conftest import ScriptedEngine
from tests.search_r1.model_families import FAMILIES, LLAMA3_TEMPLATE, build_tokenizer
from verl.config import CONFIG_DIR
from verl.tools import ToolSpec, build_tools, read_tool_config
from verl.utils.tokenizer import render_prompt
from verl.workers.rollout.base import SamplingParams

QWEN_TOOLS_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{%- else %}{% set system = 'You are a helpful assistant.' %}{% endif %}"
    "<|im_start|>system\n{{ system }}"
    "{%- if tools %}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>{% endif %}<|im_end|>\n"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- elif m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Renders an assistant message that is not the last one without its <think> block (as Qwen3's template does): the
# history re-renders differently from what the policy saw, which the sanity check must report.
THINK_DROPPING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{%- if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
    "{%- else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

TEXTS = ["Paris is the capital and largest city of France. Marie Curie was a physicist and chemist.",
         '<tool_call>{"name": "search", "arguments": {"query": "capital of France"}}</tool_call>',
         "<think> I should search. </think> <answer> Paris </answer> Doc 1 (id: paris, Title: Paris) "
         "<tool_response> Error: unknown tool", HERMES_TEMPLATE, "You are a helpful assistant. # Tools"] * 3
EOS = {"qwen": "<|im_end|>", "llama": "<|eot_id|>", "think": "<|im_end|>"}


def family_tokenizer(name: str):
    base = FAMILIES["llama" if name == "llama" else "qwen2"]
    template = {"qwen": QWEN_TOOLS_TEMPLATE, "llama": LLAMA3_TEMPLATE, "think": THINK_DROPPING_TEMPLATE}[name]
    return build_tokenizer(dataclasses.replace(base, template=template), TEXTS)


@pytest.fixture(scope="module", params=["qwen", "llama"])
def chat(request):
    """(family name, its tokenizer)."""
    return request.param, family_tokenizer(request.param)


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def hermes_run(tokenizer, scripts: dict[str, list[str]], service_url: str, tool_config_path: str | None = None,
               **cfg_kw):
    """Run the hermes loop over scripted turns (prompt question -> turn texts) -> (result, engine, prompts)."""
    schemas = [t.schema for t in read_tool_config(tool_config_path)] if tool_config_path else [SEARCH_SCHEMA]
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": make_prompt(q, HERMES_TEMPLATE)}], schemas)
               for q in scripts]
    engine = ScriptedEngine(tokenizer, {tuple(p): turns for p, turns in zip(prompts, scripts.values(), strict=True)})
    cfg = search_config(max_turns=2, max_start_length=1024, max_prompt_length=4096, max_response_length=96,
                        max_obs_length=400, do_search=True, topk=2, max_trajectory_length=2048, format="hermes",
                        tool_config_path=tool_config_path, **cfg_kw)
    agent = make_agent(tokenizer, engine, RetrievalClient(service_url, 2), cfg)
    return agent.run(prompts, SamplingParams(max_tokens=1, temperature=0.0)), engine, prompts


# ---------------------------------------------------------------- parsing
def test_parse_tool_calls_reads_valid_several_and_malformed_calls():
    """Guards against a lost call, a malformed call that crashes the loop instead of being answered, and a
    half-written last call taken as complete."""
    text = ('<think> two lookups </think>' + call("search", query="France") + "\n" + call("open", id="paris")
            + '<tool_call>{"name": "search", "arguments": {"query": "x"</tool_call>'  # bad JSON
            + '<tool_call>["search"]</tool_call>'  # not an object with name and arguments
            + '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"as a string\\"}"}</tool_call>'
            + '<tool_call>{"name": "search", "arguments"')  # not closed
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("search", {"query": "France"}), ("open", {"id": "paris"})]
    assert calls[2].error.startswith("the tool call is not valid JSON")
    assert "a tool call is a JSON object" in calls[3].error
    assert (calls[4].name, calls[4].arguments, calls[4].error) == ("search", {"query": "as a string"}, None)
    assert "not closed" in calls[5].error
    assert parse_tool_calls("<answer> Paris </answer>") == []


def test_check_calls_names_unknown_tools_wrong_argument_types_and_the_parallel_limit():
    """Guards against a call of an unknown tool or with arguments of the wrong type reaching a tool, and against more
    calls than max_parallel_calls running in one turn: each gets an error naming the problem and what is allowed."""
    tools = build_tools([ToolSpec("SearchTool", {}, SEARCH_SCHEMA), ToolSpec("OpenTool", {}, OPEN_SCHEMA)],
                        ToolEnv(retrieve=None, client=object(), do_search=True))
    calls = [ToolCall("search", {"query": "a"}), ToolCall("browse", {"url": "x"}), ToolCall("search", {"query": 3}),
             ToolCall("open", {}), ToolCall("search", {"query": "b"}), ToolCall("open", {"id": "c"})]
    check_calls(calls, tools, max_parallel_calls=2)
    assert [c.error is None for c in calls] == [True, False, False, False, True, False]
    assert calls[1].error == "unknown tool 'browse': the tools are open, search"
    assert "'query'" in calls[2].error and "3 is not of type 'string'" in calls[2].error
    assert "'id' is a required property" in calls[3].error
    assert "at most 2 tool calls run per turn" in calls[5].error


# ---------------------------------------------------------------- token-in/token-out and the sanity check
def test_incremental_insertions_equal_a_full_re_render(chat):
    """Guards against the appended ids (closing of the assistant turn + tool messages + generation prompt) differing
    from what the chat template gives for the whole conversation, for a template with tool support (Qwen-style) and
    one without (Llama-style, schemas in the system message): the sanity check finds them equal over three turns
    with one and two tool messages."""
    name, tokenizer = chat
    fmt = ChatFormat(tokenizer, [SEARCH_SCHEMA, OPEN_SCHEMA])
    assert fmt.native_tools is (name == "qwen")
    eos = tokenizer.convert_tokens_to_ids(EOS[name])
    turns = []
    for content, results in [(call("search", query="France"), ["Doc 1 (id: paris, Title: Paris) Paris is ..."]),
                             (call("open", id="paris") + call("search", query="Curie"), ["Paris is the capital", "x"]),
                             ("I know it now.", ["feedback"])]:
        messages = [{"role": "tool", "content": r} for r in results]
        turns.append((content, eos, messages, fmt.insertion(messages, tokenizer.decode([eos]))))
        assert fmt.check(turns) is None
    full = fmt.render([{"role": "user", "content": "Question?"}] + [m for c, _, ms, _ in turns
                                                                   for m in [{"role": "assistant", "content": c}, *ms]],
                      generation_prompt=True)
    assert "<tool_response>\nParis is the capital\n</tool_response>" in full and "search" in full


@pytest.mark.slow  # the retrieval service runs in its own process
def test_sanity_check_reports_a_template_that_re_renders_the_history(service_url, caplog):
    """Guards against a silent train/inference mismatch: with a template that drops earlier turns' <think> blocks
    (as Qwen3's does), the ids the policy saw differ from a full re-render; the loop counts it
    (agent/tokenization_mismatch), warns once naming the position, and does not crash."""
    tokenizer = family_tokenizer("think")
    scripts = {"What is the capital of France": ["<think> I should search. </think>" + call("search", query="France")
                                                 + "<|im_end|>", "<answer> Paris </answer>"]}
    with caplog.at_level(logging.WARNING, logger="search_r1.llm_agent.hermes"):
        result, _, _ = hermes_run(tokenizer, scripts, service_url)
    traj = result.trajectories[0]
    assert traj.stop_reason is StopReason.ANSWERED and traj.tokenization_mismatch == 1
    assert result.metrics()["agent/tokenization_mismatch"] == 1.0
    assert "tokenisation sanity check" in caplog.text and "at token" in caplog.text


# ---------------------------------------------------------------- the loop
def segments(traj) -> list[tuple[int, list[int]]]:
    """The response as runs of equal mask: (mask, ids)."""
    out, pos = [], 0
    for mask, run in itertools.groupby(traj.info_mask):
        n = len(list(run))
        out.append((mask, traj.response_ids[pos:pos + n]))
        pos += n
    return out


@pytest.mark.slow  # the retrieval service runs in its own process
def test_hermes_loop_searches_and_answers_with_tag_format_masks(chat, service_url, make_engine):
    """Guards against tool results being trained on (mask 1), policy tokens masked out, or the hermes trajectory
    having another structure than the tag format's for the same content: a search then an answer gives, in both
    formats, policy | inserted | policy, mask 1 exactly on the ids the engine sampled, 0 on the rest."""
    name, tokenizer = chat
    eos = EOS[name]
    hermes, engine, _ = hermes_run(tokenizer, {"What is the capital of France": [
        "<think> search </think>" + call("search", query="capital of France") + eos, "<answer> Paris </answer>"]},
        service_url)
    traj = hermes.trajectories[0]
    assert traj.stop_reason is StopReason.ANSWERED and traj.num_searches == traj.num_tool_calls == 1
    assert traj.tokenization_mismatch == 0 and traj.num_invalid_calls == 0
    sampled = next(iter(engine.emitted.values()))
    assert [(m, ids) for m, ids in segments(traj) if m == 1] == [(1, ids) for ids in sampled]
    inserted = tokenizer.decode(segments(traj)[1][1])
    assert "Doc 1 (id: paris, Title: Paris) Paris is the capital" in inserted
    assert inserted.rstrip().endswith("assistant") or inserted.endswith("assistant\n") or \
        inserted.endswith("<|end_header_id|>\n\n")

    # the same content in the tag format (the tag-format engine fixture's tokenizer): the same mask structure
    tag_tok = family_tokenizer(name)
    prompt = tag_tok(make_prompt("What is the capital of France"), add_special_tokens=False)["input_ids"]
    tag_engine = ScriptedEngine(tag_tok, {tuple(prompt): ["<think> search </think><search> capital of France "
                                                          "</search>", "<answer> Paris </answer>"]})
    cfg = search_config(max_turns=2, max_start_length=1024, max_prompt_length=4096, max_response_length=96,
                        max_obs_length=400, do_search=True, topk=2, max_trajectory_length=2048)
    tag = make_agent(tag_tok, tag_engine, RetrievalClient(service_url, 2), cfg).run(
        [prompt], SamplingParams(max_tokens=1, temperature=0.0)).trajectories[0]
    assert [m for m, _ in segments(tag)] == [m for m, _ in segments(traj)] == [1, 0, 1]
    assert [(1, ids) for ids in next(iter(tag_engine.emitted.values()))] == [s for s in segments(tag) if s[0] == 1]


@pytest.mark.slow  # the retrieval service runs in its own process
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_malformed_calls_get_readable_errors_and_parallel_calls_all_run(service_url, mode):
    """Guards against a malformed call ending the row or crashing the loop, and against losing one of several calls
    of a turn: bad JSON and an unknown tool are answered with errors (agent/invalid_calls = 2) while the turn's two
    searches both run; a turn with only malformed calls counts as invalid. Both schedules (lockstep: every row's
    calls of a turn in one phase; async: each row's calls at once, searches through the coalescer); a second row
    that answers at once shares the schedule."""
    tokenizer = family_tokenizer("qwen")
    result, _, _ = hermes_run(tokenizer, {"Who discovered polonium": [
        '<tool_call>{"name": "search", "arguments": {"query": </tool_call><|im_end|>',
        call("search", query="polonium") + call("browse", url="x") + call("search", query="capital of Japan")
        + "<|im_end|>",
        "<answer> Marie Curie </answer>"], "What is the capital of Japan": ["<answer> Tokyo </answer>"]},
        service_url, mode=mode)
    assert result.trajectories[1].stop_reason is StopReason.ANSWERED
    traj = result.trajectories[0]
    assert traj.stop_reason is StopReason.ANSWERED
    assert (traj.num_tool_calls, traj.num_invalid_calls, traj.num_searches, traj.num_invalid) == (2, 2, 2, 1)
    text = tokenizer.decode(traj.response_ids)
    assert "Error: the tool call is not valid JSON" in text and "Error: unknown tool 'browse'" in text
    assert text.count("Doc 1 (id:") == 2 and result.metrics()["agent/invalid_calls"] == 2.0
    assert "Doc 1 (id: curie, Title: Marie Curie)" in text and "Doc 1 (id: tokyo, Title: Tokyo)" in text


@pytest.mark.slow  # the retrieval service runs in its own process
def test_open_reads_a_whole_document_cut_to_max_tool_response_length(service_url, tmp_path):
    """Guards against the open tool returning a snippet, an unknown id crashing the loop, and a long page escaping
    max_tool_response_length: POST /doc answers whole documents by id and a 404 naming an unknown id; in the loop a
    page over the limit is cut with a notice, an unknown id gets an error message."""
    with RetrievalClient(service_url, 2) as client:
        paris, missing = client.documents(["paris", "atlantis"])
    assert paris["id"] == "paris" and paris["contents"].startswith('"Paris"\nParis is the capital') and missing is None
    response = httpx.post(service_url + "/doc", json={"ids": ["curie", "atlantis"]})
    assert response.status_code == 404 and response.json()["id"] == "atlantis"
    assert "atlantis" in response.json()["detail"]
    assert httpx.post(service_url + "/doc", json={"ids": [3]}).status_code == 422

    tokenizer = family_tokenizer("qwen")
    result, _, _ = hermes_run(tokenizer, {"Where was Marie Curie born": [
        call("open", id="curie") + call("open", id="atlantis") + "<|im_end|>", "<answer> Warsaw </answer>"]},
        service_url, str(CONFIG_DIR / "tools" / "search_open.yaml"), max_tool_response_length=12)
    text = tokenizer.decode(result.trajectories[0].response_ids)
    assert "[... cut: 12 of" in text and '"Marie Curie"' in text and "radium" not in text
    assert result.trajectories[0].truncated_obs == 1 and result.metrics()["agent/truncated_obs"] == 1.0
    assert "Error: no document has the id 'atlantis'" in text


# ---------------------------------------------------------------- the cold start in hermes format
@pytest.mark.slow  # the retrieval service runs in its own process
def test_hermes_cold_start_rows_have_the_hermes_loops_tokens_and_masks(chat, service_url, tmp_path):
    """Guards against a hermes cold start that teaches another layout than the RL loop produces (a prompt without
    the tools, a tool message rendered otherwise, a missing end-of-turn token, the loss on inserted tokens): the
    scripted searcher's hermes rows, tokenised by the SFT trainer's dataset, equal the hermes loop's packed rollout
    when a policy writes the same turns against the same service, for both chat templates."""
    import torch

    from data_prep.cold_start import HermesTurns, rows_to_sft_parquet, scripted_cold_start
    from data_prep.qa_search import make_row, rows_to_parquet
    from verl.utils.dataset import PromptDataset
    from verl.utils.sft_dataset import TrajectoryDataset

    _, tokenizer = chat
    client = RetrievalClient(service_url, 2)
    qa = [make_row("toy", "What is the capital of France", ["Paris"], "train", 0),
          make_row("toy", "Who was born in Warsaw and won two Nobel prizes", ["Marie Curie"], "train", 1,
                   template=HERMES_TEMPLATE)]  # QA data made for either format
    rows_to_parquet(qa, tmp_path / "qa.parquet")
    rows, counts = scripted_cold_start(str(tmp_path / "qa.parquet"), client.search, write=HermesTurns(tokenizer))
    assert counts["one_search"] == 2 and all(json.loads(r["tools"]) == [SEARCH_SCHEMA] for r in rows)
    rows_to_sft_parquet(rows, tmp_path / "sft.parquet")
    sft = TrajectoryDataset(str(tmp_path / "sft.parquet"), tokenizer, max_length=8192).batch(range(len(rows)))

    prompts = PromptDataset(str(tmp_path / "sft.parquet"), tokenizer, 4096, tools=[SEARCH_SCHEMA])
    engine = ScriptedEngine(tokenizer, {tuple(ids): [t["text"] for t in row["turns"] if t["sampled"]]
                                        for ids, row in zip(prompts.prompt_ids, rows, strict=True)})
    cfg = search_config(max_turns=2, max_start_length=4096, max_prompt_length=4096, max_response_length=96,
                        max_obs_length=400, do_search=True, topk=2, max_trajectory_length=2048, format="hermes")
    rl = make_agent(tokenizer, engine, client, cfg)(prompts.batch(range(len(rows))),
                                                              SamplingParams(max_tokens=1, temperature=0.0))
    assert list(rl["stop_reason"]) == ["answered"] * 2 and list(rl["num_searches"]) == [1, 1]
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask", "info_mask"):
        assert torch.equal(sft[key], rl[key]), key
    assert torch.equal(sft["loss_mask"], rl["response_mask"] * rl["info_mask"])


# ---------------------------------------------------------------- config
def test_multi_turn_keys_reach_the_loop_and_bad_tool_configs_are_named(tmp_path, service_url):
    """Guards against the multi_turn keys being read into the wrong loop settings, and a tool config that is
    missing, malformed or names an unknown class passing until the first rollout."""
    from verl.config import load_config
    from verl.errors import ConfigError
    from verl.tools import run_tool_specs

    only_open = {"tools": [{"class_name": "OpenTool", "tool_schema": OPEN_SCHEMA}]}
    (tmp_path / "tools.yaml").write_text(json.dumps(only_open))
    cfg = load_config(["actor_rollout_ref.rollout.multi_turn.format=hermes",
                       f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'tools.yaml'}",
                       "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
                       "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2", "data.max_obs_length=77"])
    agent = make_agent(family_tokenizer("qwen"), None, RetrievalClient(service_url, 3), cfg)
    assert (type(agent.format), agent.max_turns, agent.format.max_parallel_calls) == (HermesFormat, 4, 2)
    assert list(agent.format.tools) == ["open"] and agent.format.result_limit == 77  # null: data.max_obs_length
    assert [s.class_name for s in run_tool_specs(load_config(["actor_rollout_ref.rollout.multi_turn.format=hermes"]))
            ] == ["SearchTool"]  # null: the recipe's DEFAULT_TOOLS
    assert run_tool_specs(load_config([])) is None  # the tag format shows no tools

    for content, message in [("tools: []", "non-empty list 'tools'"),
                             (json.dumps({"tools": [{"class_name": "Nope", "tool_schema": OPEN_SCHEMA}]}),
                              "unknown tool class_name 'Nope': registered are SearchTool, OpenTool"),
                             (json.dumps({"tools": [{"class_name": "OpenTool", "tool_schema": {"type": "function"}}]}),
                              "tools[0] (OpenTool): tool_schema must be")]:
        (tmp_path / "bad.yaml").write_text(content)
        bad = load_config(["actor_rollout_ref.rollout.multi_turn.format=hermes",
                           f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'bad.yaml'}"])
        with pytest.raises(ConfigError, match=re.escape(message)):
            run_tool_specs(bad)
    with pytest.raises(ConfigError, match="multi_turn.format"):
        load_config(["actor_rollout_ref.rollout.multi_turn.format=xml"])
