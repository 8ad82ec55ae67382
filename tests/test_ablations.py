"""benchmarks/ablations.py: an output directory is resumed only with the warm-start code that built it."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
from benchmarks import ablations  # noqa: E402  (a namespace package: the repository root is on sys.path)


def test_source_hash_is_the_launchers():
    script = 'source scripts/launch_common.sh; demo_source_hash'
    shell = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert shell.stdout.strip() == ablations.source_hash()


def test_out_built_by_other_code_is_refused(tmp_path):
    ablations.check_source(tmp_path)  # empty: stamped
    assert (tmp_path / "source_hash").read_text().strip() == ablations.source_hash()
    (tmp_path / "seed0" / "warm_start").mkdir(parents=True)
    (tmp_path / "seed0" / "warm_start" / "warm_start.json").write_text("{}")
    ablations.check_source(tmp_path)  # same code: resumed
    (tmp_path / "source_hash").write_text("0" * 64 + "\n")
    with pytest.raises(SystemExit, match="built by other code"):
        ablations.check_source(tmp_path)
    (tmp_path / "source_hash").unlink()
    with pytest.raises(SystemExit, match="unrecorded code"):
        ablations.check_source(tmp_path)
