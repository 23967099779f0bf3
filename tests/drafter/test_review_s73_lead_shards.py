"""Session 73, lead: a shard whose number lies outside the count its own name gives is refused in one line."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.drafter.checkpoint import read_checkpoint, save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError


@pytest.fixture
def saved(tmp_path):
    cfg = DrafterConfig(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, draft_vocab_size=37, target_vocab_size=101, target_hidden_size=40,
                        aux_layer_ids=[2, 4, 5])
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg)
    drafter.d2t.zero_()  # draft id i is target token i
    drafter.t2d.zero_()
    drafter.t2d[:37] = True
    path = save_drafter(drafter, tmp_path / "d")
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    return path, state


def _shards(path, state, names):
    keys = sorted(state)
    for i, name in enumerate(names):
        save_file({k: state[k] for k in keys[i::len(names)]}, str(path / name))


@pytest.mark.parametrize(("names", "odd", "count"), [
    (["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model-00003-of-00002.safetensors"],
     "model-00003-of-00002.safetensors", 2),
    (["model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
     "model-00000-of-00002.safetensors", 2),
    (["model-00001-of-00000.safetensors"], "model-00001-of-00000.safetensors", 0),
])
def test_a_shard_numbered_past_its_count_is_one_line_naming_it(saved, names, odd, count):
    path, state = saved
    _shards(path, state, names)
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path}: shard {odd} is numbered past the count its name gives ({count}): a shard of "
                            "another save, or a file renamed by hand")


def test_shards_numbered_within_their_count_read_whole(saved):
    path, state = saved
    _shards(path, state, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"])
    assert set(read_checkpoint(path).tensors) >= set(state)
