"""The teacher's turn text under the servers' stop-string conventions (``data_prep.teacher.closed``); the teacher end
to end, against a real model behind ``transformers serve``, is in ``test_cold_start.py``."""

from __future__ import annotations

import pytest

from data_prep.teacher import closed
from search_r1.llm_agent.tags import parse_action
from verl.agent.trajectory import ActionKind


@pytest.mark.parametrize(("text", "finish", "expected", "kind"), [
    ("<think> x </think><search> Laemze", "stop", ("<think> x </think><search> Laemze</search>", "</search>"),
     ActionKind.ACT),  # OpenAI's API: the stop string is dropped
    ("<search> Laemze </search>", "stop", ("<search> Laemze </search>", "</search>"), ActionKind.ACT),  # kept
    ("<answer> Brede Foundry </answer>\n", "stop", ("<answer> Brede Foundry </answer>", "</answer>"),
     ActionKind.ANSWER),  # kept, with what a last token carried past it
    ("<search> a </search> <answer> b", "stop", ("<search> a </search>", "</search>"), ActionKind.ACT),
    ("I am done.", "stop", ("I am done.", None), ActionKind.EOS),  # an end of turn without a tag
    ("<answer> Brede", "length", ("<answer> Brede", None), ActionKind.LENGTH),  # cut by max_tokens: no tag added
])
def test_a_turn_ends_at_its_stop_string_whatever_the_server_returns(text, finish, expected, kind):
    """Guards against a search or answer lost because the server dropped the stop string (OpenAI), or kept it (vLLM's
    include_stop_str_in_output, transformers serve), and against closing a tag of a turn cut by max_tokens."""
    assert closed(text, finish) == expected
    assert parse_action(expected[0], "length" if finish == "length" else "stop", expected[1], cut=False)[0] is kind
