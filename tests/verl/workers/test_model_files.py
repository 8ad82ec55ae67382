"""``check_model_files``: a damaged model directory is named before any worker loads it.

Guards against the damage that ``from_pretrained`` reports only as a traceback from inside a worker (or, for a
lost shard of a sharded checkpoint, after minutes of loading the others): a shard named by the weights index
that is missing, a zipped ``pytorch_model.bin`` cut short, a directory without weights, a generation config
that is not JSON (read only when the trained policy is saved, at the end of the run).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from data_prep.tiny_model import save_tiny_model
from verl.workers.model_files import check_model_files


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", ["who founded the guild?"] * 20, vocab_size=300)


def copy(model_dir, tmp_path, name: str = "m"):
    return shutil.copytree(model_dir, tmp_path / name)


def test_a_whole_model_passes(model_dir):
    check_model_files(str(model_dir))


def test_damaged_weights_and_configs_are_named(model_dir, tmp_path):
    sharded = copy(model_dir, tmp_path, "sharded")
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"model.safetensors.index.json names model-00002-of-00002.safetensors, "
                                         r"which is missing"):
        check_model_files(str(sharded))

    as_bin = copy(model_dir, tmp_path, "bin")
    (as_bin / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(1000)}, as_bin / "pytorch_model.bin")
    check_model_files(str(as_bin))
    data = (as_bin / "pytorch_model.bin").read_bytes()
    (as_bin / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"pytorch_model.bin is damaged or truncated \([\d,]+ bytes: no zip directory"):
        check_model_files(str(as_bin))

    (as_bin / "pytorch_model.bin").unlink()
    with pytest.raises(ValueError, match=r"holds no weights \(allowed: model.safetensors"):
        check_model_files(str(as_bin))

    bad_generation = copy(model_dir, tmp_path, "generation")
    (bad_generation / "generation_config.json").write_text("{'eos_token_id': 1}")
    with pytest.raises(ValueError, match=r"generation_config.json is not valid JSON"):
        check_model_files(str(bad_generation))
