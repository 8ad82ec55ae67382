"""The viewer's page and terminal output for a run directory of real trajectories (``recorded_run``: the search
loop over the memorised tiny policy and the real retrieval service, scored and given advantages by the trainer's
phases), read back as a browser's DOM would hold it (``page_dom``) without running its script."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.search_r1.inspect.recorded_run import response_of, runs_of
from tests.search_r1.inspect.viewer import articles, inspect, no_display_env, option_counts, page_of, read_page

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]  # an engine, a service


def test_every_trajectory_is_on_the_page_with_exactly_its_inserted_tokens_marked(recorded, tmp_path):
    """Guards against a viewer that drops or merges trajectories, marks policy text as inserted (or passages as the
    policy's), loses text between spans, or shows token counts that are not the batch's: for every row of every
    batch, the page's inserted spans are, in order, exactly the runs of info_mask 0 decoded, with their lengths, and
    the policy spans the runs of 1; answer, gold answers and advantage are the batch's."""
    run_dir, steps, tokenizer = recorded
    dom = page_of(tmp_path, str(run_dir))
    shown = articles(dom)
    assert len(shown) == sum(len(s.records) for s in steps) == len(dom.by_class("row"))
    inserted_seen = 0
    for s in steps:
        for i, record in enumerate(s.records):
            article = shown.pop((s.split, str(s.step), record["uid"]))
            ids, info = response_of(s.batch, i)
            spans = article.by_class("seg")
            runs = runs_of(ids, info)
            assert len(spans) == len(runs)
            for span, (m, run) in zip(spans, runs, strict=True):
                kind = "policy" if m == 1 else "inserted"
                assert span.attrs["class"] == f"seg {kind}"
                # (a NUL cannot be HTML text: a browser shows U+FFFD for it, and the page writes that)
                assert span.text == tokenizer.decode(run).replace("\x00", "\ufffd")
                assert span.attrs["data-tokens"] == str(len(run))
                inserted_seen += kind == "inserted"
            assert sum(int(span.attrs["data-tokens"]) for span in spans) == len(ids)
            assert article.by_class("answer-text")[0].text == (record["answer"] or "— (none)")
            assert article.by_class("gold")[0].text == " | ".join(record["ground_truth"])
            advantage = article.find_all(lambda e: e.attrs.get("data-term") == "advantage")[0]
            expected = "—" if s.split == "val" else f"{record['advantage']:.3f}"
            assert advantage.find_all(lambda e: e.tag == "td")[0].text == expected
    assert not shown
    assert inserted_seen >= 9, "the recorded run must hold inserted passages and feedback for this test to mean much"


def test_filter_counts_and_fields_are_the_batches(recorded, tmp_path):
    """Guards against filters that count wrongly (a right answer counted as wrong, a trajectory that searched
    counted as not, a step's size off): each option's count equals a plain count over the batches, and the fields
    the script filters on (EM, searched, length, terms) are the batch's for every row."""
    run_dir, steps, _ = recorded
    dom = page_of(tmp_path, str(run_dir))
    rows = {r["id"]: r for r in json.loads(dom.by_id("trajectory-data").text)["rows"]}
    steps_count, splits, outcomes, searched = Counter(), Counter(), Counter(), Counter()
    for s in steps:
        for i in range(len(s.batch)):
            steps_count[str(s.step)] += 1
            splits[s.split] += 1
            outcomes["right" if s.batch["reward/em"][i] == 1.0 else "wrong"] += 1
            searched["yes" if s.batch["num_searches"][i] > 0 else "no"] += 1
    total = sum(steps_count.values())
    assert option_counts(dom, "f-step") == {"": total, **steps_count}
    assert option_counts(dom, "f-split") == {"": total, **splits}
    assert option_counts(dom, "f-outcome") == {"": total, **outcomes}
    assert option_counts(dom, "f-search") == {"": total, **searched}
    assert set(outcomes) == {"right", "wrong"} and set(searched) == {"yes", "no"}, "the run must show both of each"
    by_key = {(a.attrs["data-split"], a.attrs["data-step"], a.attrs["data-uid"]): a.attrs["data-key"]
              for a in dom.by_class("trajectory")}
    for s in steps:
        for i, record in enumerate(s.records):
            row = rows[by_key[(s.split, str(s.step), record["uid"])]]
            assert row["em"] == float(s.batch["reward/em"][i])
            assert row["searched"] == (int(s.batch["num_searches"][i]) > 0)
            assert row["length"] == int(s.batch["response_mask"][i].sum())
            assert row["terms"]["f1"] == float(s.batch["reward/f1"][i]) and row["score"] == float(s.batch["score"][i])


def test_the_page_loads_nothing_and_shows_markup_in_a_text_as_text(recorded, tmp_path):
    """Guards against a page that fetches anything (a script, font, style or image from a URL: it must open offline
    and leak nothing), and against a trajectory text holding markup (a passage with a script tag) becoming part of
    the page instead of being shown as the text it is."""
    run_dir, steps, _ = recorded
    hostile = dict(steps[1].records[0], uid="hostile", output='<script src="https://example.com/x.js"></script>',
                   segments=[{"kind": "policy", "text": '<img src="http://example.com/a.png"></script>', "tokens": 3}])
    files = tmp_path / "files"
    files.mkdir()
    (files / "5.jsonl").write_text(json.dumps(hostile) + "\n")
    for source in (str(run_dir), str(files)):
        page = tmp_path / "page.html"
        assert inspect(source, "--out", str(page)).returncode == 0
        dom = read_page(page)
        tags = Counter(e.tag for e in dom.iter())
        assert tags["script"] == 2 and not tags["link"] and not tags["img"] and not tags["iframe"]
        for e in dom.iter():
            assert "src" not in e.attrs and "href" not in e.attrs, e
            assert not any("://" in (v or "") for v in e.attrs.values()), e
        style = "".join(e.text for e in dom.iter() if e.tag == "style")
        assert "url(" not in style and "@import" not in style
        (csp,) = dom.find_all(lambda e: e.attrs.get("http-equiv") == "Content-Security-Policy")
        assert "default-src 'none'" in csp.attrs["content"]
    (span,) = dom.by_class("seg")
    assert span.text == '<img src="http://example.com/a.png"></script>'


def test_a_large_run_is_sampled_and_the_page_says_of_how_many(recorded, tmp_path):
    """Guards against a page that silently shows part of a run as if it were all of it, or that draws another
    sample on every call: --limit 5 of the run's 15 trajectories shows exactly 5 of them, says "a sample of 5 of
    15", counts its filters over those 5, and shows the same 5 when run again."""
    run_dir, steps, _ = recorded
    written = {(s.split, str(s.step), r["uid"]) for s in steps for r in s.records}
    first, second = (articles(page_of(tmp_path, str(run_dir), "--limit", "5")) for _ in range(2))
    assert len(first) == 5 and set(first) <= written and set(first) == set(second)
    dom = page_of(tmp_path, str(run_dir), "--limit", "5")
    assert dom.by_id("sample-note").text.startswith("A sample of 5 of 15 trajectories")
    assert option_counts(dom, "f-outcome")[""] == 5
    assert len(articles(page_of(tmp_path, str(run_dir), "--step", "1"))) == 6  # --step: that step only


def test_text_mode_prints_the_list_and_one_trajectory_without_a_display(recorded, tmp_path):
    """Guards against --text needing a browser or display, writing a page nobody asked for, or hiding the inserted
    text: with no DISPLAY the list prints every trajectory, and --show prints the passages the service inserted,
    marked with their token count, the query and the answer."""
    run_dir, steps, tokenizer = recorded
    console_script = Path(sys.executable).parent / "search-r1-inspect"  # setup.py's console command
    done = subprocess.run([str(console_script), str(run_dir), "--text"], cwd=tmp_path, env=no_display_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "All 15 trajectories." in done.stdout and not list(tmp_path.iterdir())  # nothing written
    table_rows = [line for line in done.stdout.splitlines() if "row" in line and ("train" in line or "val" in line)]
    assert len(table_rows) == 15
    step = steps[1]
    done = inspect(str(run_dir), "--text", "--step", "2", "--split", "train", "--show", "row0/0", env=no_display_env())
    assert done.returncode == 0, done.stderr
    ids, info = response_of(step.batch, 0)
    (inserted,) = [run for m, run in runs_of(ids, info) if m == 0]
    assert f"[inserted by the environment: {len(inserted)} tokens, no gradient]" in done.stdout
    passage = tokenizer.decode(inserted).strip().splitlines()[0]  # "<information>Doc 1(Title: Paris) ..."
    assert passage.startswith("<information>Doc 1") and passage in done.stdout
    assert "capital of France" in done.stdout and "answer: 'Paris'" in done.stdout


def test_todays_rollout_files_are_shown_as_far_as_they_go(recorded, tmp_path):
    """Guards against the viewer refusing (or misreading) the files runs write today: a run directory whose
    config.yaml names trainer.rollout_data_dir (written by today's write_rollouts from the same batches) shows every
    row with its step, score and answer, the response as one unmarked block under a note, and EM unknown (today's
    records hold no gold answers) rather than guessed."""
    run_dir, steps, _ = recorded
    old_run = tmp_path / "old_run"
    old_run.mkdir()
    (old_run / "config.yaml").write_text(f"trainer:\n  rollout_data_dir: {run_dir / 'rollout_data_dir'}\n")
    dom = page_of(tmp_path, str(old_run))
    shown = dom.by_class("trajectory")  # (today's uid is the dataset row: the samples of a prompt share it)
    train = [s for s in steps if s.split == "train"]
    assert len(shown) == sum(len(s.records) for s in train)
    assert option_counts(dom, "f-outcome") == {"": len(shown), "unknown": len(shown)}
    assert option_counts(dom, "f-step") == {"": len(shown), **{str(s.step): len(s.records) for s in train}}
    for article in shown:
        assert [span.attrs["class"] for span in article.by_class("seg")] == ["seg unmarked"]
        assert article.by_class("note")
    shown_rows = Counter((a.attrs["data-step"], a.attrs["data-uid"], a.by_class("answer-text")[0].text) for a in shown)
    assert shown_rows == Counter((str(s.step), r["group"], r["answer"] or "— (none)") for s in train for r in s.records)
