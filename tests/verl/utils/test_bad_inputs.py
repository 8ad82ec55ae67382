"""Bad data, paths and checkpoints: each fails before training with an error naming the problem and the fix.

Guards against: a parquet file without the prompt or reward columns, a row with no golden answer (every
reward silently 0), prompts too long for data.max_prompt_length, a model path that does not exist, and a
damaged checkpoint directory surfacing as tracebacks from deep inside pyarrow, transformers or
torch.distributed.checkpoint (or, for the empty answers, as a run that learns nothing).
"""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed.checkpoint as dcp

from data_prep.qa_search import make_row, rows_to_parquet
from data_prep.tiny_model import train_tokenizer
from verl.config import ConfigError, check_paths, load_config
from verl.utils import checkpoint
from verl.utils.dataset import DataError, PromptDataset


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["Who founded the guild of Vuzaholm? <search> q </search>"] * 5, vocab_size=300)


def rows(n: int = 3) -> list[dict]:
    return [make_row("toy", f"Who founded guild {i}", [f"name {i}"], "train", i) for i in range(n)]


def write(path, records: list[dict]):
    pq.write_table(pa.Table.from_pylist(records), path)
    return str(path)


def test_missing_columns_are_named_with_the_schema(tokenizer, tmp_path):
    records = [{k: v for k, v in r.items() if k != "reward_model"} for r in rows()]
    with pytest.raises(DataError, match=r"lacks the column\(s\) \['reward_model'\].*Search-R1 schema"):
        PromptDataset(write(tmp_path / "a.parquet", records), tokenizer, 256)
    with pytest.raises(DataError, match=r"lacks the column\(s\) \['question'\]"):
        PromptDataset(write(tmp_path / "b.parquet", rows()), tokenizer, 256, prompt_key="question")


@pytest.mark.parametrize("ground_truth", [{"target": []}, {"target": ["", "  "]}, {"target": None}, None])
def test_empty_golden_answers_name_the_row(tokenizer, tmp_path, ground_truth):
    records = rows()
    records[1]["reward_model"] = {"style": "rule", "ground_truth": ground_truth}
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    with pytest.raises(DataError, match=rf"row 1 of '{path}': no golden answer .*at least one non-empty string"):
        PromptDataset(str(path), tokenizer, 256)


def test_prompt_that_is_not_chat_messages_is_named(tokenizer, tmp_path):
    records = rows()
    records[2]["prompt"] = [{"role": "user", "content": None}]
    with pytest.raises(DataError, match=r"row 2 of .*non-empty list of chat messages"):
        PromptDataset(write(tmp_path / "p.parquet", records), tokenizer, 256)


def test_absurdly_long_prompts_are_dropped_or_an_error_saying_how_long(tokenizer, tmp_path, caplog):
    records = rows(4)
    records[3]["prompt"] = [{"role": "user", "content": "guild " * 50_000}]
    path = write(tmp_path / "long.parquet", records)
    with caplog.at_level("WARNING", logger="verl.utils.dataset"):
        assert len(PromptDataset(path, tokenizer, 1024)) == 3
    assert "dropped 1 of 4 rows" in caplog.text and "row 3: " in caplog.text
    only_long = write(tmp_path / "only.parquet", records[3:])
    with pytest.raises(DataError, match=r"every row .* longer than data.max_prompt_length=1024 tokens \(prompts have "
                                        r"\d+ to \d+ tokens\); raise data.max_prompt_length"):
        PromptDataset(only_long, tokenizer, 1024)


def test_missing_model_and_data_paths_name_the_key(tmp_path):
    rows_to_parquet(rows(), tmp_path / "ok.parquet")
    data = [f"data.train_files={tmp_path / 'ok.parquet'}", f"data.val_files={tmp_path / 'ok.parquet'}"]
    cfg = load_config([*data, f"actor_rollout_ref.model.path={tmp_path / 'no_model'}"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.path=.*no_model' is invalid: no such directory"):
        check_paths(cfg)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ConfigError, match=r"model.path=.*empty_dir' is invalid: the directory has no config.json"):
        check_paths(load_config([*data, f"actor_rollout_ref.model.path={tmp_path / 'empty_dir'}"]))
    (tmp_path / "empty_dir" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"data.val_files=.*nope.parquet' does not exist"):
        check_paths(load_config([data[0], f"data.val_files={tmp_path / 'nope.parquet'}",
                                 f"actor_rollout_ref.model.path={tmp_path / 'empty_dir'}"]))
    with pytest.raises(ConfigError, match=r"config key retriever.url is not set: name your retrieval service"):
        check_paths(load_config([*data, f"actor_rollout_ref.model.path={tmp_path / 'empty_dir'}"]))  # issue 37
    check_paths(load_config([*data, f"actor_rollout_ref.model.path={tmp_path / 'empty_dir'}", "do_search=false"]))


def committed(root, step: int):
    """A checkpoint directory with every file ``verify`` checks, all real (a torch.distributed.checkpoint shard and
    its .metadata per worker, trainer.pt, extra_state.pt)."""
    tmp = checkpoint.begin(root, step)
    for part in ("actor", "critic"):
        with warnings.catch_warnings():  # that it runs in one process, as asked
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save({"model": {"w": torch.arange(64.0)}}, checkpoint_id=tmp / part, no_dist=True)
        torch.save({"scheduler": {}}, tmp / part / "extra_state.pt")
    return checkpoint.commit(root, tmp, step, {"step": step, "loader": {}, "kl_coef": 0.0}, "a: 1\n")


def test_corrupt_checkpoints_are_refused_naming_the_path_and_the_fix(tmp_path):
    good = committed(tmp_path, 1)
    checkpoint.verify(good, ["actor", "critic"])
    bad = committed(tmp_path, 2)
    (bad / "trainer.pt").write_bytes(b"\x00garbage")
    with pytest.raises(checkpoint.CheckpointError, match=rf"checkpoint {bad} is corrupt: .*delete {bad} to resume "
                                                         r"from the checkpoint before it"):
        checkpoint.verify(bad, ["actor"])
    (bad / "critic" / ".metadata").unlink()
    with pytest.raises(checkpoint.CheckpointError, match=r"incomplete or corrupt: missing critic/.metadata"):
        checkpoint.verify(bad, ["actor", "critic"])


def test_truncated_or_missing_shards_are_refused_before_loading(tmp_path):
    """Guards against a shard cut short (a full disk, an interrupted copy) or lost passing ``verify`` and failing
    as a traceback from inside torch.distributed.checkpoint when the workers load it."""
    path = committed(tmp_path, 1)
    (shard,) = (path / "actor").glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(checkpoint.CheckpointError, match=rf"incomplete or corrupt: actor/{shard.name} is truncated "
                                                         r"\(100 bytes; its .metadata needs [\d,]+\); delete"):
        checkpoint.verify(path, ["actor", "critic"])
    shard.unlink()
    with pytest.raises(checkpoint.CheckpointError, match=rf"actor/{shard.name} is missing"):
        checkpoint.verify(path, ["actor"])
    (path / "critic" / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(checkpoint.CheckpointError, match=r"is corrupt: critic/.metadata does not load"):
        checkpoint.verify(path, ["critic"])


def test_only_committed_checkpoints_are_found_whatever_the_marker_says(tmp_path):
    """A kill between the rename and the marker update, or during a write, never hides or exposes the wrong one."""
    committed(tmp_path, 1)
    committed(tmp_path, 2)
    (tmp_path / checkpoint.LATEST).write_text("1")  # the marker lags behind the last rename
    (tmp_path / "global_step_3.tmp").mkdir()  # a write in progress
    assert checkpoint.find_latest(tmp_path) == tmp_path / "global_step_2"
    assert checkpoint.find_latest(tmp_path, at_most=1) == tmp_path / "global_step_1"
    committed(tmp_path, 3)
    assert not (tmp_path / "global_step_3.tmp").exists()
