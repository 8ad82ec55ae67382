"""Tests of the QA rewards: normalisation, answer extraction, EM / sub-EM / F1, format rule, compute_score."""

from __future__ import annotations

import re
import string

import numpy as np
import pytest

from data_prep.tiny_model import train_tokenizer
from search_r1.config import RewardConfig
from search_r1.prompts import make_prompt
from search_r1.recipe import build_recipe
from search_r1.reward import (
    DATA_SOURCE_SCORERS,
    DEFAULT_NORMALIZE,
    NORMALIZERS,
    SCORERS,
    compute_score,
    em_check,
    extract_answer,
    f1_score,
    is_valid_format,
    normalize_answer,
    subem_check,
)
from verl.config import ConfigError, declared, load_config
from verl.protocol import Batch


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple\t a day\n", "apple day"),
        ("U.S.A.!", "usa"),
        ("Theatre of the Absurd", "theatre of absurd"),  # 'the' inside a word stays
        ("“Paris”—France", "parisfrance"),  # unicode quotes and dash are punctuation
        ("—dash—", "dash"),
        ("rock–paper–scissors", "rockpaperscissors"),  # en dashes
        ("‘single’ «guillemets»", "single guillemets"),
        ("ＰＡＲＩＳ", "paris"),  # full-width letters via NFKC
        ("ﬁnal", "final"),  # ligature via NFKC
        ("Cha\u0301vez", "ch\u00e1vez"),  # decomposed accent composed by NFKC, accent kept
        ("", ""),
    ],
)
def test_normalize_unicode_tricky_strings(raw: str, expected: str) -> None:
    """Guards against the unicode mode missing articles/punctuation/case/width or mangling words containing 'the'."""
    assert normalize_answer(raw, "unicode") == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple\t a day\n", "apple day"),
        ("U.S.A.!", "usa"),
        ("Theatre of the Absurd", "theatre of absurd"),
        ("“Paris”—France", "“paris”—france"),  # Unicode punctuation is kept, as in SQuAD's script
        ("—dash—", "—dash—"),
        ("rock–paper–scissors", "rock–paper–scissors"),
        ("rock-paper-scissors", "rockpaperscissors"),  # ASCII hyphens are removed
        ("‘single’ «guillemets»", "‘single’ «guillemets»"),
        ("ＰＡＲＩＳ", "ｐａｒｉｓ"),  # no NFKC: full-width letters stay full width (lower-cased)
        ("Cha\u0301vez", "cha\u0301vez"),  # no NFKC: the decomposed accent stays decomposed
        ("", ""),
    ],
)
def test_normalize_squad_is_the_published_recipe(raw: str, expected: str) -> None:
    """Guards against the default drifting from the SQuAD/Search-R1/FlashRAG recipe (ASCII punctuation only,
    no NFKC), which would make our scores incomparable with published tables."""
    assert normalize_answer(raw) == expected
    assert normalize_answer(raw, "squad") == expected
    assert _squad_reference(raw) == expected


def _squad_reference(s: str) -> str:
    """SQuAD v1.1's normalize_answer, written out step by step in the test."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


@pytest.mark.parametrize(
    ("prediction", "golden", "squad", "unicode"),
    [
        ("—dash—", "dash", 0.0, 1.0),
        ("rock–paper–scissors", "rock paper scissors", 0.0, 0.0),  # the dash is removed, not spaced
        ("rock–paper–scissors", "rockpaperscissors", 0.0, 1.0),
        ("“Paris”", "Paris", 0.0, 1.0),
        ("Paris", "“Paris”", 0.0, 1.0),
        ('"Paris"', "Paris", 1.0, 1.0),  # ASCII quotes: both modes
    ],
)
def test_em_under_both_normalisations(prediction: str, golden: str, squad: float, unicode: float) -> None:
    """Guards against the normalize option not reaching EM / compute_score (the reward and the evaluation)."""
    assert em_check(prediction, [golden], "squad") == squad
    assert em_check(prediction, [golden], "unicode") == unicode
    response = f"<answer>{prediction}</answer>"
    assert compute_score("nq", response, {"target": [golden]}) == squad
    assert compute_score("nq", response, {"target": [golden]}, normalize="unicode") == unicode


def test_unknown_normalisation_names_the_valid_ones() -> None:
    """Guards against a typo in reward.normalize silently scoring with some other recipe."""
    with pytest.raises(ValueError, match="squad, unicode"):
        normalize_answer("x", "ascii")
    with pytest.raises(ValueError, match="unknown normalisation 'nfkc'"):
        compute_score("nq", "no answer here", ["x"], normalize="nfkc")


def test_config_key_reward_normalize() -> None:
    """Guards against the config offering other names than the scorer implements, and a bad value passing."""
    assert declared(RewardConfig, "normalize").allowed_choices() == tuple(NORMALIZERS)
    assert load_config().reward.normalize == DEFAULT_NORMALIZE == "squad"
    assert load_config(["reward.normalize=unicode"]).reward.normalize == "unicode"
    with pytest.raises(ConfigError, match=r"reward\.normalize='ascii' is invalid: allowed one of squad, unicode"):
        load_config(["reward.normalize=ascii"])


@pytest.mark.parametrize("mode", ["squad", "unicode"])
def test_training_reward_and_validation_use_reward_normalize(mode: str) -> None:
    """Guards against the trainer's reward or its validation EM ignoring reward.normalize (training and
    evaluation must score alike)."""
    cfg = load_config([f"reward.normalize={mode}", "do_search=false"])
    recipe = build_recipe(cfg, train_tokenizer(["<answer> x </answer>"] * 3, vocab_size=300), generator=None)
    response = "<answer>—Paris—</answer>"
    expected = 1.0 if mode == "unicode" else 0.0
    assert recipe.score("nq", response, {"target": ["Paris"]}, None) == expected
    batch = Batch(non_tensors={"data_source": ["nq"], "ground_truth": [{"target": ["Paris"]}],
                               "num_searches": [0], "num_turns": [1]})
    assert recipe.row_metrics([response], batch)["em"].tolist() == [expected]


def test_accents_are_kept_but_encodings_unified() -> None:
    """Guards against composed vs decomposed accents scoring differently, and against silently stripping accents."""
    assert em_check("Chávez", ["Cha\u0301vez"], "unicode") == 1.0
    assert em_check("Chavez", ["Chávez"], "unicode") == 0.0
    assert em_check("Chavez", ["Chávez"]) == 0.0


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>x</think><answer> Paris </answer>", "Paris"),
        ("<answer>Lyon</answer> wait <answer>Paris</answer>", "Paris"),
        ("<answer>Lyon</answer><answer>Paris", "Lyon"),  # the last COMPLETE block
        ("<answer>Paris", None),
        ("Paris</answer>", None),
        ("no tags at all", None),
        ("<answer></answer>", ""),
        ("<answer>a<answer>Paris</answer>", "Paris"),
        ("<answer>\nline one\nline two\n</answer>", "line one\nline two"),
    ],
)
def test_extract_answer(response: str, expected: str | None) -> None:
    """Guards against taking the first instead of the last answer and against accepting unclosed tags."""
    assert extract_answer(response) == expected


def test_answer_inside_a_hermes_tool_response_is_ignored() -> None:
    """Guards against scoring text a tool returned (hermes format) as the policy's answer."""
    response = ('<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>\nuser\n<tool_response>\n'
                "Doc 1 <answer>Paris</answer>\n</tool_response>\nassistant\n")
    assert extract_answer(response) is None
    assert extract_answer(response + "<answer> Lyon </answer>") == "Lyon"


def test_answer_inside_retrieved_information_is_ignored() -> None:
    """Guards against crediting an <answer> tag that the environment inserted inside a retrieved passage."""
    response = "<search>q</search><information>Doc 1 <answer>Paris</answer></information>"
    assert extract_answer(response) is None
    assert extract_answer(response + "<answer>Rome</answer>") == "Rome"
    assert extract_answer("<search>q</search><information>cut off <answer>Paris</answer>") is None


def test_only_response_is_scored_not_prompt() -> None:
    """Guards against scoring the prompt's example answer: the prompt holds '<answer> Paris </answer>'."""
    prompt = make_prompt("What is the capital of France")
    assert extract_answer(prompt) == "Paris"  # the template's example: the reason to score the response only
    response = "<think>I do not know</think>"
    assert compute_score("nq", response, {"target": ["Paris"]}) == 0.0


def test_em_several_golden_answers() -> None:
    """Guards against comparing with the first golden answer only, and a bare string being split into chars."""
    assert em_check("the big apple", ["NYC", "Big Apple", "New York"]) == 1.0
    assert em_check("big", ["NYC", "Big Apple"]) == 0.0
    assert em_check("Paris", "paris.") == 1.0
    assert em_check("p", "Paris") == 0.0


def test_subem_token_boundaries() -> None:
    """Guards against plain substring matching crediting '4' inside '1945' or 'art' inside 'Mozart'."""
    assert subem_check("It was New York City, I think", ["new york"]) == 1.0
    assert subem_check("1945", ["4"]) == 0.0
    assert subem_check("Mozart", ["art"]) == 0.0
    assert subem_check("The year 1945.", ["1945"]) == 1.0


def test_golden_answer_normalising_to_empty_is_ignored() -> None:
    """Guards against a golden answer like 'The' (normalises to '') making sub-EM credit every prediction."""
    assert subem_check("anything", ["The"]) == 0.0
    assert em_check("a", ["The"]) == 0.0
    assert subem_check("rome", ["The", "Rome"]) == 1.0


def test_empty_golden_list_is_an_error() -> None:
    """Guards against silently scoring 0 for a row with no golden answers (a data bug)."""
    with pytest.raises(ValueError, match="no golden answers"):
        em_check("x", [])


@pytest.mark.parametrize(
    ("prediction", "golden", "expected"),
    [
        # pred {barack, obama} vs gold {barack, hussein, obama}: p=2/2, r=2/3 -> f1=0.8
        ("Barack Obama", ["Barack Hussein Obama"], 0.8),
        # pred {new, york, city, usa} vs gold {new, york}: p=2/4, r=2/2 -> f1=2/3
        ("New York City, USA", ["New York"], 2 / 3),
        # repeated tokens match once per occurrence: 'big big dog' vs 'big dog': p=2/3, r=2/2 -> f1=0.8
        ("big big dog", ["big dog"], 0.8),
        ("Paris", ["Rome"], 0.0),
        # max over golden answers: 2/3 vs 1.0
        ("the Obama", ["Barack Obama", "Obama"], 1.0),
        ("", ["Rome"], 0.0),
    ],
)
def test_f1_hand_computed(prediction: str, golden: list[str], expected: float) -> None:
    """Guards against F1 using sets instead of multisets, mixing up precision/recall, or not taking the max."""
    assert f1_score(prediction, golden) == pytest.approx(expected)


@pytest.mark.parametrize(
    "response",
    [
        "<think>t</think><answer>x</answer>",
        "<answer>x</answer>",
        "  <think>t</think>\n<search>q</search>\n\n<information>Doc 1(Title: a) b</information>\n\n"
        "<think>t</think><answer>x</answer>\n",
        "<search>q</search><information>i</information><search>q2</search><information>i2</information>"
        "<answer>x</answer>",
        "<search>q</search><information>docs with a stray </think> and <answer>tag</information><answer>x</answer>",
    ],
)
def test_valid_format(response: str) -> None:
    """Guards against rejecting well-formed trajectories (optional think, several searches, odd passage text)."""
    assert is_valid_format(response)


@pytest.mark.parametrize(
    "response",
    [
        "",
        "<think>t</think>",  # no answer
        "<answer>x</answer><answer>y</answer>",  # two answers
        "<answer>x</answer><think>t</think>",  # answer not last
        "<search>q</search><answer>x</answer>",  # search without information
        "<information>i</information><answer>x</answer>",  # information without search
        "<think>t</think><think>u</think><answer>x</answer>",  # two thinks in a row
        "<think>t<answer>x</answer></think>",  # nested
        "<think>t</think>chatter<answer>x</answer>",  # text outside blocks
        "<answer>x</answer> trailing",
        "<think>t</think></search><answer>x</answer>",  # stray closing tag
        "<think>t<answer>x</answer>",  # unclosed think
    ],
)
def test_invalid_format(response: str) -> None:
    """Guards against the format bonus rewarding malformed trajectories."""
    assert not is_valid_format(response)


def test_compute_score_ground_truth_shapes() -> None:
    """Guards against failing on parquet round-trips: ground truth as dict, list, str or numpy array of strings."""
    response = "<think>t</think><answer> paris </answer>"
    assert compute_score("nq", response, {"target": ["Paris", "Paris, France"]}) == 1.0
    assert compute_score("nq", response, {"target": np.array(["Rome", "Paris"], dtype=object)}) == 1.0
    assert compute_score("nq", response, np.array(["Paris"])) == 1.0
    assert compute_score("nq", response, ["Rome"]) == 0.0
    assert compute_score("nq", response, "Paris") == 1.0


def test_compute_score_format_score() -> None:
    """Guards against the format bonus going to malformed or answerless trajectories, or overriding a correct one."""
    good_wrong = "<think>t</think><answer>Rome</answer>"
    bad_wrong = "chatter <answer>Rome</answer>"
    good_right = "<think>t</think><answer>Paris</answer>"
    truth = {"target": ["Paris"]}
    assert compute_score("nq", good_wrong, truth, format_score=0.2) == pytest.approx(0.2)
    assert compute_score("nq", bad_wrong, truth, format_score=0.2) == 0.0
    assert compute_score("nq", "<think>t</think>", truth, format_score=0.2) == 0.0
    assert compute_score("nq", good_right, truth, format_score=0.2) == 1.0
    assert compute_score("nq", good_wrong, truth) == 0.0


def test_compute_score_selects_scorer_by_data_source() -> None:
    """Guards against ignoring the default scorer for unknown sources or the mapping for known ones."""
    response = "<answer>it is New York City</answer>"
    truth = {"target": ["New York"]}
    assert compute_score("nq", response, truth, default_scorer="subem") == 0.0  # nq -> em
    assert compute_score("demo_capitals", response, truth, default_scorer="subem") == 0.0  # demo_* -> em
    assert compute_score("my_source", response, truth, default_scorer="subem") == 1.0
    assert compute_score("my_source", response, truth, default_scorer="f1") == pytest.approx(2 * 0.4 * 1 / 1.4)
    assert set(DATA_SOURCE_SCORERS.values()) <= set(SCORERS)


def test_unknown_scorer_lists_valid_names() -> None:
    """Guards against a typo in reward.default_scorer silently falling back to some scorer."""
    with pytest.raises(ValueError, match="em, f1, subem"):
        compute_score("nq", "<answer>x</answer>", ["x"], default_scorer="exact")
