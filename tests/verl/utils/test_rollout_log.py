"""The trajectory records' pieces (verl/utils/rollout_log.py): the segments of a response and the sample of a batch,
each checked against a plain loop.

Guards against a sample that splits a GRPO group (its samples' scores and advantages could no longer be compared),
keeps more rows than its cap, or keeps only the batch's first prompts; and against segments that merge or drop
tokens (their counts must add up to the response, run by run of the info mask).
"""

from __future__ import annotations

import random

import pytest

from data_prep.tiny_model import train_tokenizer
from verl.utils.rollout_log import sample_rows, segments


@pytest.mark.parametrize("prompts, n, cap", [(512, 5, 64), (6, 4, 64), (8, 2, 4), (3, 8, 5), (10, 1, 3), (4, 2, 0)])
def test_a_sample_keeps_whole_groups_spread_over_the_batch_within_its_cap(prompts, n, cap):
    groups = [f"row{p}" for p in range(prompts) for _ in range(n)]
    kept = sample_rows(groups, cap)
    assert kept == sorted(kept) and len(kept) <= max(cap, 0) and len(set(kept)) == len(kept)
    if len(groups) <= cap:
        assert kept == list(range(len(groups)))
        return
    if cap == 0:
        assert kept == []
        return
    by_group: dict[str, list[int]] = {}
    for i in kept:
        by_group.setdefault(groups[i], []).append(i)
    if n <= cap:  # whole groups, as many as fit, from the first prompt to the last
        assert all(len(rows) == n for rows in by_group.values())
        assert len(by_group) == min(cap // n, prompts)
        if len(by_group) >= 2:
            assert {groups[kept[0]], groups[kept[-1]]} == {"row0", f"row{prompts - 1}"}
    else:  # a group larger than the cap: the first cap rows of one group
        assert len(by_group) == 1 and len(kept) == cap


def test_segments_are_the_runs_of_the_info_mask_decoded_on_their_own():
    tokenizer = train_tokenizer(["<think> search this </think> <information> Doc 1 text </information> answer"] * 5,
                                vocab_size=300)
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(5, 200) for _ in range(rng.randrange(1, 40))]
        mask = [1] + [rng.choice([0, 1, 1]) for _ in ids[1:]]
        expected, start = [], 0
        for end in range(1, len(ids) + 1):  # plain loop: close a run where the mask changes or the response ends
            if end == len(ids) or mask[end] != mask[start]:
                expected.append(("policy" if mask[start] else "inserted", ids[start:end]))
                start = end
        got = segments(ids, mask, tokenizer)
        assert [(s["kind"], s["tokens"]) for s in got] == [(kind, len(run)) for kind, run in expected]
        assert [s["text"] for s in got] == [tokenizer.decode(run, skip_special_tokens=False) for _, run in expected]
        assert sum(s["tokens"] for s in got) == len(ids)
