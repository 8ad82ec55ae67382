"""benchmarks/bench_real_step.py --report: the step table read back from the trainer's metrics.jsonl."""

import json

import pytest

from benchmarks import bench_real_step


def write_run(folder, steps):
    """A run directory whose metrics.jsonl holds one record per (step seconds, rows cut, response length), plus a
    validation record without timings (as the trainer writes)."""
    folder.mkdir(parents=True)
    lines = [json.dumps({"step": 0, "val/test_score": 0.5})]
    for i, (seconds, cut, length) in enumerate(steps, start=1):
        lines.append(json.dumps({"step": i, "timing/step": seconds, "timing/gen": seconds / 2, "timing/ref": 1.0,
                                 "timing/update_actor": seconds / 4, "agent/cut/max_response_length": cut,
                                 "response_length/mean": length}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_report_pools_runs_skips_first_steps_and_compares_at_like_work(tmp_path, capsys):
    """Guards against counting a run's first step (engine load), against a variant's runs not being pooled, against
    the ratio's baseline being the wrong variant, and against the no-cut median including steps with a row cut."""
    write_run(tmp_path / "hf-sync-full_run0", [(999, 0, 100), (150, 2, 200), (140, 1, 190), (80, 0, 150)])
    write_run(tmp_path / "hf-sync-full_run1", [(999, 0, 100), (90, 0, 160)])
    write_run(tmp_path / "hf-sync-full_run2", [(999, 0, 100)])  # stopped after its first step: nothing counted
    write_run(tmp_path / "vllm-sync_run0", [(999, 0, 100), (50, 0, 150), (60, 0, 160), (100, 3, 210)])

    assert bench_real_step.main(["--report", "--variants", "hf-sync-full,vllm-sync", "--out", str(tmp_path)]) == 0
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| hf-") or line.startswith("| vllm-")}
    hf, vllm = rows["hf-sync-full"], rows["vllm-sync"]
    # hf: steps 150, 140, 80, 90 -> median 115; cut in 2 of 4; no-cut steps 80, 90 -> 85
    assert [hf[0], hf[4], hf[5], hf[7], hf[8], hf[9].rstrip(" |")] == ["115.0", "4", "2", "1.00x", "85.0", "1.00x"]
    # vllm: steps 50, 60, 100 -> median 60 (0.52x); no-cut 50, 60 -> 55 (0.65x of 85)
    assert [vllm[0], vllm[4], vllm[5], vllm[7], vllm[8], vllm[9].rstrip(" |")] == [
        "60.0", "3", "1", "0.52x", "55.0", "0.65x"]


def test_report_names_the_missing_variant(tmp_path):
    write_run(tmp_path / "hf-sync-full_run0", [(999, 0, 100), (150, 0, 200)])
    with pytest.raises(SystemExit, match=r"no run of vllm-sync under .*vllm-sync_run\*/metrics.jsonl"):
        bench_real_step.main(["--report", "--variants", "hf-sync-full,vllm-sync", "--out", str(tmp_path)])


def test_a_continued_benchmark_pools_only_its_runs(tmp_path):
    """--first-run K pools runs 0..K+runs-1: a later run left under --out, or another folder, is not counted."""
    write_run(tmp_path / "vllm-sync_run0", [(999, 0, 100), (50, 0, 150)])
    write_run(tmp_path / "vllm-sync_run1", [(999, 0, 100), (70, 0, 150)])
    write_run(tmp_path / "vllm-sync_run2", [(999, 0, 100), (500, 0, 150)])
    write_run(tmp_path / "vllm-sync_run1_old", [(999, 0, 100), (500, 0, 150)])
    got = bench_real_step.report(tmp_path, ["vllm-sync"], count_first=False, upto=2)
    assert got["vllm-sync"]["step"] == [50, 70]


def test_report_says_when_only_first_steps_were_recorded(tmp_path):
    write_run(tmp_path / "vllm-sync_run0", [(999, 0, 100)])
    with pytest.raises(SystemExit, match="vllm-sync: no step to count .*vllm-sync_run0.*--steps 1"):
        bench_real_step.main(["--report", "--variants", "vllm-sync", "--out", str(tmp_path)])
    assert bench_real_step.main(["--report", "--steps", "1", "--variants", "vllm-sync", "--out", str(tmp_path)]) == 0
