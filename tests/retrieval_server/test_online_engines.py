"""Each online engine's documented answers, parsed in-process (no service): results, the no-results answers,
error answers and shapes that are not the engine's.

Guards against: an engine's error answered as "no results" (a dead key would train on empty searches) or a
no-results answer treated as an error (SerpAPI sends an ``error`` text with a Success status when Google finds
nothing); a result with a missing snippet failing the whole query; markup or entities reaching the passage.
"""

from __future__ import annotations

import pytest

from retrieval_server.search.online.engines import ENGINES, EngineError, error_text, plain_text


def test_results_become_search_r1_passages():
    serpapi = {"search_metadata": {"status": "Success"},
               "organic_results": [{"position": 1, "title": "Laemze &amp; more", "link": "https://a.test/1",
                                    "snippet": "Written by <b>Dreinpei</b>  Firbam."},
                                   {"position": 2, "title": "No snippet", "link": "https://a.test/2"}]}
    passages = [r.passage() for r in ENGINES["serpapi"].parse(serpapi)]
    assert passages == [{"id": "https://a.test/1", "contents": '"Laemze & more"\nWritten by Dreinpei Firbam.'},
                        {"id": "https://a.test/2", "contents": '"No snippet"\n'}]
    brave = {"type": "search", "web": {"results": [{"title": "T", "url": "https://b.test", "description":
                                                    "<strong>x</strong> y"}]}}
    assert [r.passage() for r in ENGINES["brave"].parse(brave)] == [{"id": "https://b.test", "contents": '"T"\nx y'}]


@pytest.mark.parametrize("engine, payload", [
    ("serpapi", {"search_metadata": {"status": "Success"}, "error": "Google hasn't returned any results for this "
                                                                    "query."}),
    ("serpapi", {"search_information": {"organic_results_state": "Fully empty"}}),
    ("google", {"kind": "customsearch#search", "searchInformation": {"totalResults": "0"}}),
    ("serper", {"organic": []}),
    ("brave", {"type": "search"}),
])
def test_documented_no_results_answers_are_empty(engine, payload):
    assert ENGINES[engine].parse(payload) == []


@pytest.mark.parametrize("engine, payload, message", [
    ("serpapi", {"search_metadata": {"status": "Error"}, "error": "Invalid API key."},
     "serpapi answered an error: Invalid API key."),
    ("google", {"error": {"code": 403, "message": "Daily limit exceeded", "status": "PERMISSION_DENIED"}},
     "google answered an error: 403: PERMISSION_DENIED: Daily limit exceeded"),
    ("serper", {"message": "Not enough credits", "statusCode": 400}, "serper answered an error: Not enough credits"),
    ("brave", {"web": []}, "brave answered web as a list, not an object"),
    ("google", {"items": [{"title": 7, "link": "x"}]}, "google answered items[0].title as 7, not a string"),
    ("serper", {"organic": ["a"]}, "serper answered organic[0] as a str, not an object"),
    ("serpapi", ["not", "an", "object"], "serpapi answered a JSON list, not an object"),
])
def test_errors_and_wrong_shapes_name_the_engine_and_the_field(engine, payload, message):
    with pytest.raises(EngineError) as raised:
        ENGINES[engine].parse(payload)
    assert str(raised.value) == message


def test_error_text_and_plain_text():
    assert error_text(b'{"error": {"code": 429, "detail": "Too many"}}') == "429: Too many"
    assert error_text(b"<html>Bad gateway</html>") == "<html>Bad gateway</html>"
    assert plain_text("a&nbsp;<i>b</i>\n c") == "a b c"
