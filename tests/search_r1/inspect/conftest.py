"""Fixtures of the viewer's tests: a run directory of real trajectories (``recorded_run``), two evaluations of
the same policy (by ``search_r1.evaluate``, as it writes them today) and a headless Chromium.

The browser is Debian's ``chromium`` driven through ``chromium-driver`` by selenium, with a fresh profile and the
flags that keep it from reaching the network on its own; ``.ci/run`` installs both where they are missing. The
browser tests are skipped, saying why, only where neither is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep.qa_search import make_row, rows_to_parquet
from tests.search_r1.inspect.recorded_run import FRANCE, ROWS, RecordedStep, write_run
from tests.search_r1.inspect.viewer import ROOT
from tests.search_r1.memorised_policy import TOPK
from tests.shared_builds import built_once

EVAL_ROWS = [*ROWS, (FRANCE, ["Lyon"])]  # (question, gold answers): the policy gets rows 0 and 1 right

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,900"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, policy, service_url) -> tuple[Path, list[RecordedStep], object]:
    """(run directory, what its steps hold, the tokenizer)."""
    model_dir, tokenizer, *_ = policy
    run_dir = tmp_path_factory.mktemp("run")
    return run_dir, write_run(run_dir, model_dir, tokenizer, service_url), tokenizer


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium (selenium WebDriver) with a fresh profile; quit at teardown."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("Debian's chromium and chromium-driver are not installed and could not be (`.ci/run` installs "
                    "them as root: apt-get install -y chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(options=options, service=Service(driver))
    yield session
    session.quit()


@pytest.fixture(scope="session")
def evaluations(tmp_path_factory, policy, service_url) -> tuple[Path, Path]:
    """Two evaluation directories of the memorised policy, by ``search_r1.evaluate`` on ``EVAL_ROWS``: A with the
    default budgets (it searches and answers: rows 0 and 1 right), B with ``data.max_trajectory_length=30`` (the
    passages no longer fit: no answer, every row wrong). Built once per test run (``built_once``); read only."""
    model_dir, *_ = policy

    def build(root: Path) -> None:
        rows_to_parquet([make_row("toy", q, gold, "test", i) for i, (q, gold) in enumerate(EVAL_ROWS)],
                        root / "test.parquet")
        for name, extra in (("a", []), ("b", ["data.max_trajectory_length=30"])):
            done = subprocess.run([sys.executable, "-m", "search_r1.evaluate", "--model", str(model_dir), "--data",
                                   str(root / "test.parquet"), "--retriever-url", service_url, "--out",
                                   str(root / name), f"retriever.topk={TOPK}", *extra], cwd=ROOT,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]

    root = built_once(tmp_path_factory, "inspect_evaluations", build)
    return root / "a", root / "b"
