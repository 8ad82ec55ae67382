"""The column table of a training step (``verl/trainer/columns.py``): one checked write for every column.

Guards against: a phase that silently overwrites a column an earlier phase made (the in-place writes that went
around ``Batch.union``'s check), writes a column nobody declared, replaces a column that is not there, or reads
one before the phase that makes it ran (a KeyError deep in a worker instead of an error naming the phase); a
write that bypasses the checked function; and a table that drifts from the code (the batch's columns after each
phase of a step, the phases' own functions and one real step, compared against the table).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.verl.trainer.trainer_test_utils import ROOT, overrides
from verl.algorithms import core_algos
from verl.config import load_config
from verl.protocol import Batch
from verl.trainer import columns
from verl.trainer.columns import PHASES, STEP, Column, ColumnError, Phase
from verl.trainer.pipeline import Generated, fill_batch
from verl.trainer.recipe import RecipeOutputError, check_generated
from verl.trainer.reward import RewardManager, apply_overlong, compute_advantages, token_rewards
from verl.utils.seq import pack_trajectories

ROWS, N = 4, 2  # 4 rows = 2 prompts x n = 2


def prompts(groups: int = ROWS // N, tag: str = "") -> Batch:
    """What ``PromptDataset.batch`` makes, each prompt repeated n times (``PPOTrainer.generate``)."""
    return Batch(non_tensors={
        "raw_prompt_ids": [[5, 6 + g] for g in range(groups)], "data_source": ["nq"] * groups,
        "ground_truth": [{"target": ["x"]}] * groups, "extra_info": [None] * groups, "index": list(range(groups)),
        "uid": [f"row{g}{tag}" for g in range(groups)]}).repeat(N)


def generate(batch: Batch, extra: dict | None = None) -> Batch:
    """A recipe's generation: packed trajectories of ragged lengths with an inserted block, the prompts' columns."""
    rows = len(batch)
    responses = [[7 + i % 3] * (3 + i) for i in range(rows)]
    info = [[1, 0] + [1] * (len(r) - 2) for r in responses]
    logprobs = [[-0.5] * len(r) for r in responses]
    tensors = pack_trajectories([list(p) for p in batch["raw_prompt_ids"]], responses, info, pad_id=0,
                                rollout_log_probs=logprobs)
    non_tensors = {**batch.non_tensors, "truncated": [i % 3 == 0 for i in range(rows)], **(extra or {})}
    return Batch(tensors, non_tensors, dict(batch.meta))


def made(batch: Batch) -> Batch:
    """The generated batch as the trainer holds it after the generate and loss_mask phases."""
    out = check_generated(generate(batch), len(batch))
    return columns.write(out, "loss_mask", loss_mask=out["response_mask"] * out["info_mask"])


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True) -> str:
        return " ".join(f"t{i}" for i in ids)


def details(batch: Batch, texts, tokenizer):
    """A composite reward's details: one logged term, a score per turn."""
    return SimpleNamespace(scores=None, row_terms={"reward/length": [len(t) for t in texts]},
                           turn_scores=[[1.0, 0.0]] * len(batch))


REWARD = RewardManager(Tokenizer(), lambda ds, text, gt, extra: float(len(text) % 5), details)


# ------------------------------------------------------------------ each check names the phase and the column
def scored() -> Batch:
    return REWARD.score_batch(made(prompts()))


def test_a_phase_writing_a_column_it_does_not_declare_fails_naming_both():
    batch = scored()
    with pytest.raises(ColumnError, match="phase 'advantages' writes column 'values', which the column table does "
                                          "not let it write"):
        columns.write(batch, "advantages", returns=batch["token_level_scores"], values=batch["token_level_scores"])
    assert "returns" not in batch  # a refused write writes nothing
    with pytest.raises(ColumnError, match="phase 'old_log_prob' writes column 'token_level_scores'"):
        columns.merge(batch, "old_log_prob", Batch({"token_level_scores": batch["token_level_scores"]}))
    with pytest.raises(ColumnError, match="no phase 'scoring' in the column table"):
        columns.write(batch, "scoring", score=np.zeros(ROWS))


def test_a_column_is_added_once_a_second_add_fails_naming_the_phase_and_the_column():
    batch = scored()
    with pytest.raises(ColumnError, match="phase 'reward' adds column 'score', but the batch already has it"):
        columns.write(batch, "reward", score=np.ones(ROWS))  # scoring a batch twice
    with pytest.raises(ColumnError, match="phase 'reward' adds column 'token_level_scores', but the batch already"):
        REWARD.score_batch(batch)
    with pytest.raises(ColumnError, match="phase 'reward' adds column 'reward/length', but the batch already has it"):
        columns.write(batch, "reward", **{"reward/length": np.zeros(ROWS)})  # a prefixed column too
    zeros = torch.zeros(ROWS, batch["responses"].shape[1])
    batch = columns.merge(batch, "old_log_prob", Batch({"old_log_probs": zeros, "entropy": zeros}))
    with pytest.raises(ColumnError, match="phase 'old_log_prob' adds column 'old_log_probs', but the batch already"):
        columns.merge(batch, "old_log_prob", Batch({"old_log_probs": batch["old_log_probs"]}))  # even if equal


def test_replacing_a_missing_column_fails_naming_the_phase_and_the_column():
    batch = made(prompts())  # not scored yet
    with pytest.raises(ColumnError, match="phase 'overlong' replaces column 'token_level_scores', but the batch has "
                                          "none \\(phase 'reward' adds it and has not run on this batch\\)"):
        columns.write(batch, "overlong", token_level_scores=torch.zeros_like(batch["loss_mask"]))
    scored_batch = REWARD.score_batch(batch)
    columns.write(scored_batch, "overlong", token_level_scores=torch.ones_like(batch["loss_mask"]))  # declared: fine
    with pytest.raises(ColumnError, match="phase 'overlong' writes a column whose 'loss_mask' has shape"):
        columns.write(scored_batch, "overlong", loss_mask=scored_batch["loss_mask"][:, 1:])


def test_reading_a_column_before_its_phase_ran_fails_naming_the_phase_and_the_column():
    batch = scored()
    with pytest.raises(ColumnError, match="phase 'rewards' reads column 'token_level_scores' before any phase made "
                                          "it \\(phase 'reward' adds it"):
        columns.require(made(prompts()), "rewards")
    with pytest.raises(ColumnError, match="phase 'advantages' reads column 'token_level_rewards' before any phase "
                                          "made it \\(phase 'rewards' adds it"):
        columns.require(batch, "advantages")
    with pytest.raises(ColumnError, match="phase 'update_actor' reads column 'advantages' before any phase made it "
                                          "\\(phase 'advantages' adds it"):
        columns.require(batch, "update_actor")
    with pytest.raises(ColumnError, match="phase 'update_critic' reads column 'values'"):
        columns.run(batch, "update_critic", lambda b: Batch())
    with pytest.raises(ColumnError, match="phase 'reward' reads column 'loss_mask'"):
        REWARD.score_batch(check_generated(generate(prompts()), ROWS))  # scored before the loss_mask phase


def test_a_write_of_the_wrong_shape_names_the_phase_the_column_and_the_expected_shape():
    batch = scored()
    R = batch["responses"].shape[1]
    wide = torch.zeros(ROWS, R + 1)
    with pytest.raises(ColumnError, match=rf"phase 'values' writes a column whose 'values' has shape \[4, {R + 1}\], "
                                          rf"expected \[B, R\] = \[4, {R}\]"):
        columns.merge(batch, "values", Batch({"values": wide}))
    with pytest.raises(ColumnError, match="phase 'reward' writes a column whose 'turn_scores' is not one value per "
                                          "row"):
        columns.write(scored_batch_without("turn_scores"), "reward", turn_scores=[[1.0]] * (ROWS - 1))


def scored_batch_without(name: str) -> Batch:
    batch = scored()
    batch.non_tensors.pop(name)
    return batch


def test_the_table_checks_itself():
    """Every read and replaced column is added by an earlier phase; no column is added by two phases."""
    columns.check_table(STEP)
    late = (Phase("a", "x", reads=("b_col",)), Phase("b", "y", adds={"b_col": Column("B", "m")}))
    with pytest.raises(ColumnError, match="phase 'a' reads or replaces column 'b_col', which no earlier phase adds"):
        columns.check_table(late)
    twice = (Phase("a", "x", adds={"c": Column("B", "m")}), Phase("b", "y", adds={"c": Column("B", "m")}))
    with pytest.raises(ColumnError, match="phase 'b' adds column 'c', which phase 'a' adds already"):
        columns.check_table(twice)
    assert columns.made_by("reward/em") == "reward" and columns.made_by("loss_mask") == "loss_mask"


def test_the_recipe_declares_its_own_columns_and_may_not_take_the_tables():
    own = {"stop_reason": Column("B", "why the trajectory ended")}
    reasons = {"stop_reason": ["answered"] * ROWS}
    with pytest.raises(RecipeOutputError, match="with column 'stop_reason', which no phase declares"):
        check_generated(generate(prompts(), reasons), ROWS)
    assert "stop_reason" in check_generated(generate(prompts(), reasons), ROWS, own)
    with pytest.raises(RecipeOutputError, match="with column 'score', which no phase declares"):
        check_generated(generate(prompts(), {"score": [1.0] * ROWS}), ROWS, own)  # the reward's, made too early
    with pytest.raises(RecipeOutputError, match="declaring its own column 'score', which phase 'reward' of the table"):
        check_generated(generate(prompts()), ROWS, {"score": Column("B", "mine")})


def test_every_write_goes_through_the_checked_function():
    """No ``x.tensors[k] = v`` / ``x.non_tensors[k] = v`` (nor ``.union``) on a batch in verl/ or search_r1/ outside
    the column table's module (a dict named ``tensors`` being built is not a batch's)."""
    offenders = []
    for path in [*sorted((ROOT / "verl").rglob("*.py")), *sorted((ROOT / "search_r1").rglob("*.py"))]:
        if path.name == "columns.py" and path.parent.name == "trainer":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute) and \
                        target.value.attr in ("tensors", "non_tensors"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "union" \
                    and Path(path).is_relative_to(ROOT / "verl" / "trainer"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} (union)")
    assert not offenders, f"column writes around verl.trainer.columns.write: {offenders}"


# ------------------------------------------------------------------ the table stays true to the code
def assert_true_to_table(events: list[tuple[str, str, frozenset[str]]], own: dict[str, Column]) -> list[str]:
    """Phases in the table's order; before each (event "reads") the batch holds what it reads and nothing new;
    after each ("writes") it holds every column the phase always adds, and each column new since the phase before
    is one this phase declares. Returns the phases seen."""
    order = list(PHASES)
    assert events and events[0][:2] == ("reads", "generate"), events[:1]
    before = set(events[0][2])
    assert before == set(PHASES["prompts"].adds), "the dataset's columns are the prompts phase's"
    seen: list[str] = []
    for event, name, keys in events:
        p = PHASES[name]
        assert not seen or order.index(name) >= order.index(seen[-1]), f"phase {name} after {seen[-1]}"
        new, gone = keys - before, before - keys
        assert not gone - {"raw_prompt_ids"}, f"phase {name} dropped {sorted(gone)}"
        if event == "reads":
            assert set(p.reads) <= keys and not new, (name, sorted(set(p.reads) - keys), sorted(new))
        else:
            assert set(p.adds) <= keys, (name, sorted(set(p.adds) - keys))
            strays = [k for k in new if p.column(k) is None and not (name == "generate" and k in own)]
            assert not strays, f"phase {name} made columns it does not declare: {strays}"
        assert not columns.undeclared(keys, name, own)
        seen.append(name)
        before = set(keys)
    return list(dict.fromkeys(seen))


def test_the_phases_functions_keep_to_the_table():
    """generate -> loss_mask -> reward -> dynamic sampling (two rounds) -> overlong -> worker outputs ->
    advantages -> the updates' reads, each through its own function, compared after each phase against the table."""
    cfg = load_config(["algorithm.adv_estimator=grpo", f"actor_rollout_ref.rollout.n={N}",
                       "algorithm.overlong.mode=soft_penalty", "algorithm.overlong.buffer_len=4",
                       "data.max_trajectory_length=8"])
    rounds = iter([prompts(tag="b")])
    with columns.watch() as events:
        result = fill_batch(prompts(), lambda: next(rounds), lambda p, r: Generated(REWARD.score_batch(made(
            columns.require(p, "generate"))), p), groups=ROWS // N + 1, max_rounds=2, pad_id=0)
        batch, _ = apply_overlong(result.batch, cfg.algorithm.overlong, cfg.data.max_trajectory_length)
        like = lambda: torch.zeros(len(batch), batch["responses"].shape[1])  # noqa: E731
        batch = columns.run(batch, "old_log_prob", lambda b: Batch({"old_log_probs": like(), "entropy": like()}))
        batch = columns.run(batch, "ref", lambda b: Batch({"ref_log_prob": like()}))
        kl = core_algos.get_kl_controller("fixed", 0.001, 0.1, 1000)
        batch, _ = token_rewards(batch, cfg, kl)
        batch = compute_advantages(batch, cfg)
        columns.require(batch, "update_actor")
    # the events of the two rounds interleave generate..dynamic_sampling: check each round, then the rest
    starts = [i for i, (event, name, _) in enumerate(events) if (event, name) == ("reads", "generate")]
    assert len(starts) == 2
    assert assert_true_to_table(events[:starts[1]], {}) == ["generate", "loss_mask", "reward", "dynamic_sampling"]
    rest = events[starts[1]:]
    assert assert_true_to_table(rest, {}) == ["generate", "loss_mask", "reward", "dynamic_sampling", "overlong",
                                             "old_log_prob", "ref", "rewards", "advantages", "update_actor"]
    assert ("writes", "dynamic_sampling") in [e[:2] for e in rest]  # the second round's uids got their suffix
    assert {"turn_scores", "reward/length", "rollout_log_probs"} <= set(batch.keys())


@pytest.mark.slow
def test_one_real_step_keeps_to_the_table(workspace, tmp_path):
    """Through PPOTrainer.fit with the search recipe (one step: GAE with a critic, a KL loss so the reference runs,
    overlong masking, per-turn scores): the batch's columns before and after every phase against the table."""
    from search_r1.recipe import search_columns
    from verl.trainer.cli import split_args
    from verl.trainer.main_ppo import build_trainer

    files, args = split_args(overrides(workspace, tmp_path / "run", 1, "algorithm.adv_estimator=gae",
                                       "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.overlong.mode=mask",
                                       "reward.turn_term=retrieval_hit", "data.max_trajectory_length=20"))
    with columns.watch() as events:
        build_trainer(load_config(args, files)).fit()
    assert assert_true_to_table(events, search_columns()) == [
        "generate", "loss_mask", "reward", "overlong", "old_log_prob", "ref", "rewards", "values", "advantages",
        "update_critic", "update_actor"]
    final = events[-1][2]
    assert {"turn_scores", "reward/em", "stop_reason", "values", "ref_log_prob", "returns"} <= final
    # the critic on-policy (one mini-batch of the step's 4 rows): its update measures the values, no update_critic
    files, args = split_args(overrides(workspace, tmp_path / "on_policy", 1, "algorithm.adv_estimator=gae",
                                       "critic.ppo_mini_batch_size=4", "algorithm.overlong.mode=mask"))
    with columns.watch() as events:
        build_trainer(load_config(args, files)).fit()
    assert assert_true_to_table(events, search_columns()) == [
        "generate", "loss_mask", "reward", "overlong", "old_log_prob", "rewards", "values", "advantages",
        "update_actor"]
