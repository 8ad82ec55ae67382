"""The viewer's page in a real browser: headless Chromium opens the file from disk, a filter is applied, a
trajectory opened, and what is shown is checked; a screenshot is kept in ``outputs/test_artifacts/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from search_r1.inspect import view
from tests.search_r1.inspect.recorded_run import response_of, runs_of
from tests.search_r1.inspect.viewer import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]  # an engine, a service, a browser

ARTIFACTS = ROOT / "outputs" / "test_artifacts"


def choose(browser, select_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", select_id)).select_by_value(value)


def type_into(browser, input_id: str, text: str) -> None:
    field = browser.find_element("id", input_id)
    field.clear()
    if text:
        field.send_keys(text)


def visible_rows(browser) -> list:
    return [tr for tr in browser.find_elements("css selector", "#list tr.row") if tr.is_displayed()]


def shown(browser) -> int:
    count = int(browser.find_element("id", "shown").text)
    assert count == len(visible_rows(browser)), "the count shown is not the number of rows shown"
    return count


def screenshot(browser, tmp_path: Path, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    assert browser.save_screenshot(str(path)) and browser.save_screenshot(str(tmp_path / name))
    return path


def test_filters_and_a_trajectory_in_headless_chromium(recorded, browser, tmp_path):
    """Guards against a page that works only on paper: a script error (nothing filters, nothing opens), filters
    whose counts differ from the rows they leave, a click that shows nothing or another trajectory, inserted
    passages not visibly marked, or anything fetched when the file is opened from disk."""
    run_dir, steps, tokenizer = recorded
    page = tmp_path / "report.html"
    view(run_dir, page)
    browser.get(page.as_uri())
    records = [(s, i, r) for s in steps for i, r in enumerate(s.records)]
    assert shown(browser) == len(records)
    right = [(s, i, r) for s, i, r in records if s.batch["reward/em"][i] == 1.0]
    choose(browser, "f-outcome", "right")
    assert shown(browser) == len(right) > 0
    assert {tr.find_element("css selector", "td.right").text for tr in visible_rows(browser)} == {"1.00"}
    choose(browser, "f-split", "train")
    train_right = [(s, i, r) for s, i, r in right if s.split == "train"]
    assert shown(browser) == len(train_right)
    choose(browser, "f-term", "em")
    type_into(browser, "f-term-min", "0.5")
    assert shown(browser) == len(train_right)
    type_into(browser, "f-len-min", str(max(r["response_length"] for _, _, r in records) + 1))
    assert shown(browser) == 0
    type_into(browser, "f-len-min", "")
    choose(browser, "f-outcome", "")
    choose(browser, "f-search", "yes")
    searched = [x for x in records if x[0].split == "train" and x[0].batch["num_searches"][x[1]] > 0
                and x[0].batch["reward/em"][x[1]] >= 0.5]
    assert shown(browser) == len(searched) > 0

    row = visible_rows(browser)[0]
    uid = row.find_element("css selector", "td.uid").text
    row.click()
    article = browser.find_element("id", f"d-{row.get_attribute('data-id')}")
    assert article.is_displayed()
    assert sum(d.is_displayed() for d in browser.find_elements("css selector", "section.detail")) == 1
    step, i, record = next((s, i, r) for s, i, r in searched if r["uid"] == uid)
    assert article.find_element("css selector", ".answer-text").text == record["answer"]
    assert article.find_element("css selector", ".gold").text == " | ".join(record["ground_truth"])
    ids, info = response_of(step.batch, i)
    inserted = [tokenizer.decode(run) for m, run in runs_of(ids, info) if m == 0]
    spans = article.find_elements("css selector", ".seg.inserted")
    assert [s.get_attribute("textContent") for s in spans] == inserted
    for span in spans:
        assert span.is_displayed()
        label = browser.execute_script("return getComputedStyle(arguments[0], '::before').content", span)
        assert "inserted by the environment" in label and "no gradient" in label
        background = browser.execute_script("return getComputedStyle(arguments[0]).backgroundImage", span)
        assert background.startswith("repeating-linear-gradient")  # visibly set apart from the policy's text
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", spans[0])
    screenshot(browser, tmp_path, "inspect_view.png")
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_a_comparison_side_by_side_in_headless_chromium(evaluations, browser, tmp_path):
    """Guards against a comparison page whose filter or pairing fails in a browser: the broken questions are the
    rows shown, and a click shows that question's two trajectories next to each other, A's on the left."""
    from search_r1.inspect import compare_paths
    from search_r1.inspect.page import compare_page, write_page

    a, b = evaluations
    cmp = compare_paths(a, b)
    page = write_page(compare_page(cmp, limit=300), tmp_path / "compare.html")
    browser.get(page.as_uri())
    choose(browser, "f-change", "broken")
    assert shown(browser) == len(cmp.changed("broken")) == 2 and not cmp.changed("fixed")
    row = visible_rows(browser)[1]
    row.click()
    pair = browser.find_element("id", f"d-{row.get_attribute('data-id')}")
    side_a, side_b = pair.find_element("css selector", ".side-a"), pair.find_element("css selector", ".side-b")
    assert side_a.is_displayed() and side_b.is_displayed()
    assert sum(d.is_displayed() for d in browser.find_elements("css selector", "section.detail")) == 1
    assert side_a.location["x"] + side_a.size["width"] <= side_b.location["x"]  # A left of B
    assert side_a.location["y"] == side_b.location["y"]
    question = cmp.changed("broken")[1]
    assert side_a.find_element("css selector", ".answer-text").text == question.a[0].answer
    assert side_b.find_element("css selector", ".answer-text").text == "— (none)"
    screenshot(browser, tmp_path, "inspect_compare.png")
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
