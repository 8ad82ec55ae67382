"""benchmarks/gpu_site.sh, which the GPU scripts source on a machine where the checkout is imported through
PYTHONPATH and never installed: the project's metadata, and with it the recipe it registers, must reach that
machine's Python.

Guards against the GPU run of 2026-11-28 (commit ec14d91): every trainer launch of the GPU tier and of
benchmarks/gpu_step_check.sh stopped at "config key recipe is not set, and the installed packages register 0
recipes", because the recipe had become an entry point (setup.py, ``verl.recipes``) and the checkout there has no
metadata (its egg-info is git-ignored and does not travel). The CPU runs of the same scripts passed: here the
project is installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from verl.config.rl import RECIPES_GROUP, registered_recipes

REPO = Path(__file__).resolve().parents[2]


def test_project_metadata_puts_the_recipe_where_an_uninstalled_checkout_finds_it(tmp_path):
    site = tmp_path / "site"
    assert registered_recipes([str(site)]) == []  # nothing there before: the check below can fail
    done = subprocess.run(["bash", "-c", 'source benchmarks/gpu_site.sh && project_metadata "$1"', "_", str(site)],
                          cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert registered_recipes([str(site)]) == ["search_r1.recipe"], done.stdout + done.stderr
    # a Python without this environment's site-packages (-S: where the installed copy lives) and run outside the
    # checkout (whose own git-ignored egg-info would answer) finds it through SITE alone, as the GPU machine does;
    # registered_recipes' lookup written out, as importing verl would put the checkout, and its egg-info, on the path
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); from importlib.metadata import distributions; "
             "print(sorted({e.value for d in distributions() for e in d.entry_points "
             f"if e.group == {RECIPES_GROUP!r}}}))")
    found = [subprocess.run([sys.executable, "-S", "-c", probe, str(p)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60).stdout.strip() for p in (tmp_path / "empty", site)]
    assert found == ["[]", "['search_r1.recipe']"]


def test_carried_site_writes_the_metadata_and_puts_the_site_first_on_the_path(tmp_path):
    """``carried_site``, which every GPU script calls before it runs anything: guards against it no longer calling
    ``project_metadata`` (the failure above; until this test, only a GPU run could see it). Run in a checkout of
    links to this one, without the carried wheels (.whl/, where `make gpu-wheels` left them) and the installed
    metadata: the interpreter's own packages serve, and the site it names first on PYTHONPATH holds the recipe."""
    checkout, site = tmp_path / "checkout", tmp_path / "site"
    checkout.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in {".whl", ".git", ".venv", "build", "outputs", "data"} and "egg-info" not in entry.name:
            (checkout / entry.name).symlink_to(entry)
    script = 'source benchmarks/gpu_site.sh && carried_site "$1" && echo "PATH: $PYTHONPATH"'
    done = subprocess.run(["bash", "-c", script, "_", str(site)], cwd=checkout,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"PATH: {site}:{checkout}" in done.stdout
    assert registered_recipes([str(site)]) == ["search_r1.recipe"], done.stdout + done.stderr
