"""A sharded drafter's t2d refused in the shard that holds it, not in d2t's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.drafter.checkpoint import read_checkpoint, save_drafter
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config


def _sharded(tmp_path, edit):
    """The lab's drafter re-saved as two shards, t2d alone in the second (edited by `edit`)."""
    path = save_drafter(random_drafter(small_config(), seed=5, dtype=torch.float32), tmp_path / "d")
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    state["t2d"] = edit(state["t2d"])
    parts = {"model-00001-of-00002.safetensors": [k for k in state if k != "t2d"],
             "model-00002-of-00002.safetensors": ["t2d"]}
    for file, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(path / file))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: file for file, keys in parts.items() for k in keys}}))
    return path


def test_a_t2d_of_floats_names_its_own_shard(tmp_path):
    path = _sharded(tmp_path, lambda t2d: t2d.float())
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value).startswith(f"{path / 'model-00002-of-00002.safetensors'}: t2d must be a 1-D bool mask, ")


def test_a_t2d_that_disagrees_with_d2t_names_d2ts_shard(tmp_path):
    """A disagreement is the pair's: said where d2t, which engines read, lies."""
    def unmark_first(t2d):
        t2d = t2d.clone()
        t2d[int(t2d.nonzero()[0])] = False
        return t2d

    path = _sharded(tmp_path, unmark_first)
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value).startswith(f"{path / 'model-00001-of-00002.safetensors'}: d2t and t2d disagree: ")
