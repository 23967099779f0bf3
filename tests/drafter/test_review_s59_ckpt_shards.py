"""A sharded drafter whose index names a shard that is not there: the tensors it held read as left
out, so a whole-vocabulary drafter's lm_head was taken for the target's without a word."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import read_checkpoint, save_drafter
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config


def _sharded(tmp_path):
    """A drafter saved whole, then split in two shards with their index, as save_pretrained writes one."""
    path = tmp_path / "d"
    save_drafter(random_drafter(small_config(draft_vocab_size=101), seed=4, dtype=torch.float32), path, formats.SGLANG)
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    names = sorted(state)
    head = [n for n in names if "lm_head" in n]
    parts = {"model-00001-of-00002.safetensors": [n for n in names if n not in head],
             "model-00002-of-00002.safetensors": head}
    for file, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(path / file))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: file for file, keys in parts.items() for k in keys}}))
    return path


def test_all_shards_there_read_whole(tmp_path):
    assert read_checkpoint(_sharded(tmp_path)).has_head


def test_a_shard_the_index_names_missing_is_one_line(tmp_path):
    path = _sharded(tmp_path)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(LabError, match="model.safetensors.index.json names shard model-00002-of-00002.safetensors, "
                                       "which is missing"):
        read_checkpoint(path)
