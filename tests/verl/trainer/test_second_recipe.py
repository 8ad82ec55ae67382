"""The trainer knows no task: a second recipe (arithmetic, ``arith_recipe.py``) trains through it, and code named on
the command line (``plugins``, here ``examples/my_estimator.py``) extends what the config allows.

Guards against search settings creeping back into the trainer (a non-search recipe would then carry
``retriever.*`` or need a retrieval service), against a recipe's own section not being checked like the trainer's,
and against a plug-in's estimator being refused because the config was checked before the plug-in was imported
(or imported only in the test's process, not in the real entry point's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.tiny_model import save_tiny_model
from tests.verl.trainer.arith_recipe import ArithConfig, answer, make_rows
from tests.verl.trainer.trainer_test_utils import ROOT, metrics, overrides
from verl.config import DEMO_CONFIG, ConfigError, load_config, to_yaml
from verl.trainer.main_ppo import build_trainer, main, startup_summary

RECIPE = "tests.verl.trainer.arith_recipe"

@pytest.fixture(scope="module")
def arith_workspace(tmp_path_factory) -> Path:
    """A tiny random policy whose vocabulary covers the questions, and 8 + 4 rows of "What is a+b?"."""
    root = tmp_path_factory.mktemp("arith")
    rows = make_rows(12, max_operand=9, seed=0)
    texts = [r["prompt"][0]["content"] for r in rows] + ["<answer> 7 </answer> 12 3 5"] * 10
    save_tiny_model(root / "model", texts, vocab_size=300)
    pq.write_table(pa.Table.from_pylist(rows[:8]), root / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[8:]), root / "test.parquet")
    return root


def arith_args(ws: Path, out: Path, *extra: str) -> list[str]:
    """One GRPO step of the arithmetic recipe on the tiny policy (no --config file: the dataclass defaults)."""
    return [f"recipe={RECIPE}", f"data.train_files={ws / 'train.parquet'}", f"data.val_files={ws / 'test.parquet'}",
            f"actor_rollout_ref.model.path={ws / 'model'}", "actor_rollout_ref.rollout.name=hf",
            "data.max_prompt_length=64", "data.max_start_length=64", "data.max_response_length=8",
            "data.max_trajectory_length=8", "data.train_batch_size=4", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=1e-3",
            "trainer.total_training_steps=1", "trainer.save_freq=1", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.device=cpu",
            f"trainer.default_local_dir={out}", *extra]


def test_the_second_recipe_has_its_keys_and_not_the_search_keys(tmp_path):
    cfg = load_config([f"recipe={RECIPE}", "arith.max_operand=5"])
    assert isinstance(cfg, ArithConfig) and cfg.arith.max_operand == 5 and cfg.arith.answer_tag == "answer"
    assert "arith:" in to_yaml(cfg) and "retriever" not in to_yaml(cfg) and "max_turns" not in to_yaml(cfg)
    for search_key in ("retriever.url=http://127.0.0.1:8000", "max_turns=3", "do_search=false",
                       "reward.normalize=unicode"):
        key = search_key.split("=")[0]
        with pytest.raises(ConfigError, match=rf"unknown config key '{key}' \(recipe={RECIPE} takes the keys of "
                                              rf"{RECIPE}.ArithConfig"):
            load_config([f"recipe={RECIPE}", search_key])
    with pytest.raises(ConfigError, match="unknown config key 'retriever.url'"):
        load_config([f"recipe={RECIPE}"], [DEMO_CONFIG])  # the search demo's layer sets the retriever
    with pytest.raises(ConfigError, match=r"arith\.max_operand=0 is invalid: allowed an integer in \[1, 99\]"):
        load_config([f"recipe={RECIPE}", "arith.max_operand=0"])
    recipe_file = tmp_path / "recipe_yaml.yaml"
    recipe_file.write_text(f"recipe: {RECIPE}\narith:\n  answer_tag: sum\n")  # the recipe chosen in a --config file
    assert load_config([], [recipe_file]).arith.answer_tag == "sum"
    assert (answer("so <answer> 12 </answer> or 13", "answer"), answer("7 then 9", "answer"), answer("x", "a")) == \
        (12, 9, None)


def test_a_recipe_module_without_a_config_class_of_the_trainer_is_refused(tmp_path, monkeypatch):
    (tmp_path / "bad_recipe.py").write_text("CONFIG_CLASS = dict\n\ndef build_recipe(cfg, tokenizer, gen):\n"
                                            "    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"recipe='bad_recipe': its CONFIG_CLASS <class 'dict'> is not a subclass "
                                          r"of verl.config.Config"):
        load_config(["recipe=bad_recipe"])
    with pytest.raises(ConfigError, match="recipe='no_such_recipe_module': no such module"):
        load_config(["recipe=no_such_recipe_module"])


def test_an_unknown_plugin_is_exit_2_naming_plugins(capsys):
    assert main(["plugins=[no_such_plugin_module]"]) == 2
    err = capsys.readouterr().err
    assert "config key plugins=['no_such_plugin_module'] is invalid: module 'no_such_plugin_module' cannot be " \
           "imported" in err and "Traceback" not in err
    with pytest.raises(ConfigError, match=r"plugins='one' is invalid: allowed a list of Python module names"):
        load_config(["plugins=one"])


@pytest.mark.slow
def test_one_grpo_step_of_the_second_recipe(arith_workspace, tmp_path):
    """build_trainer + fit in-process: the step ran (metrics of step 1), saved and exported the policy."""
    out = tmp_path / "run"
    cfg = load_config(arith_args(arith_workspace, out))
    trainer = build_trainer(cfg)
    assert "arith    operands up to 9, answers in <answer>" in startup_summary(cfg, trainer)
    trainer.fit()
    step = [r for r in metrics(out) if r["step"] == 1]
    assert len(step) == 1 and "actor/pg_loss" in step[0] and "critic/score/mean" in step[0]
    assert (out / "global_step_1").is_dir() and (out / "hf_model" / "config.json").is_file()
    assert "retriever" not in (out / "config.yaml").read_text() and not (out / "retrieval.json").exists()


@pytest.mark.slow
def test_the_example_estimator_trains_through_plugins_on_the_entry_point(workspace, tmp_path):
    """``plugins=[examples.my_estimator]`` on the command line of ``python -m verl.trainer.main_ppo``: the module
    (not imported by this test) registers an estimator, which the config accepts and the trainer calls; without
    ``plugins=`` the name is refused."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = overrides(workspace, out, 1, "plugins=[examples.my_estimator]",
                     "algorithm.adv_estimator=reinforce_plus_plus_baseline", "actor_rollout_ref.rollout.n=2",
                     "trainer.device=cpu")
    done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "run      reinforce_plus_plus_baseline, 1 steps" in done.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1] and "actor/pg_loss" in records[0]
    assert "critic/vf_loss" not in records[0]  # the estimator declares no critic: none was built
    without = [a for a in args if not a.startswith("plugins=")]  # the name is not registered
    unknown = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *without], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    assert unknown.returncode == 2 and "algorithm.adv_estimator='reinforce_plus_plus_baseline' is invalid" in \
        unknown.stderr
