"""Capture, mutation audit s77/h6: what a rank other than 0 writes, the rank count a tensor-parallel load
refuses on its key/value heads alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from data_helpers import make_conversations, write_jsonl
from safetensors.torch import load_file, save_file

from drafter_lab.data import capture
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target


def test_a_rank_other_than_0_captures_but_writes_nothing(random_llama, tmp_path, monkeypatch):
    """Under torchrun rank 0 alone writes shards and manifest: a second writer would race it on every file."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1)  # one rank: nothing to broadcast
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    manifest = capture.prepare_features(random_llama, convs, tmp_path / "out", max_length=64)
    assert sum(manifest.counts(s)["sequences"] for s in ("train", "val")) == 0  # no shard row: none was written
    assert not (tmp_path / "out").exists()


def test_a_rank_count_dividing_the_heads_but_not_the_key_value_heads_is_one_line(random_llama, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")  # 4 heads, 2 key/value heads
    with pytest.raises(LabError, match="4 ranks do not divide the target's 4 attention heads and 2 key/value heads"):
        capture._load_tp_target(random_llama, torch.float32)


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_renders_the_day_rank_0_pinned(monkeypatch, world):
    """Each rank picks a day from its own clock; the one broadcast from rank 0 is the one rendered."""
    sent = []

    def broadcast_object_list(box, src):
        sent.append(list(box))
        box[0] = {"template_date": f"day of rank {src}"}  # what rank `src` holds

    monkeypatch.setattr(capture, "pinned", lambda tokenizer, kwargs, recorded: {"template_date": "day of this rank"})
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: world)
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", broadcast_object_list)
    assert capture.pinned_by_rank0(None, None) == {"template_date": "day of rank 0"}
    assert sent == [[{"template_date": "day of this rank"}]]


@pytest.fixture
def llama_copy(random_llama, tmp_path):
    return Path(shutil.copytree(random_llama, tmp_path / "model"))


def test_a_tensor_parallel_load_is_the_target_ready_to_capture(random_llama, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")  # one rank: transformers joins no group, the plan splits nothing
    tp = capture._load_tp_target(random_llama, torch.float32)
    one = load_target(random_llama, dtype=torch.float32)
    assert tp.fingerprint == one.fingerprint and tp.path == random_llama
    assert not tp.model.training and not any(p.requires_grad for p in tp.model.parameters())
    ids = torch.tensor([[1, 5, 9, 14]])
    torch.testing.assert_close(tp.model(ids).logits, one.model(ids).logits, rtol=0, atol=0)


def test_a_tensor_parallel_load_refuses_a_weight_the_files_lack(llama_copy, monkeypatch):
    """from_pretrained fills it with random values and only logs that: the capture would be of noise."""
    tensors = load_file(llama_copy / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, llama_copy / "model.safetensors", metadata={"format": "pt"})
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(LabError, match="the weight files lack model.layers.0.mlp.up_proj.weight"):
        capture._load_tp_target(llama_copy, torch.float32)


def test_a_tensor_parallel_load_names_a_missing_shard_before_loading(llama_copy, monkeypatch):
    (llama_copy / "model.safetensors").rename(llama_copy / "model-00001-of-00002.safetensors")
    names = {k: f"model-0000{1 + k.startswith('lm_head')}-of-00002.safetensors"
             for k in load_file(llama_copy / "model-00001-of-00002.safetensors")}
    (llama_copy / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LabError, match="names shard model-00002-of-00002.safetensors, which is missing"):
        capture._load_tp_target(llama_copy, torch.float32)


def test_a_tensor_parallel_load_of_an_unreadable_config_is_one_line(llama_copy, monkeypatch):
    (llama_copy / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LabError, match="^.*: cannot read the model config: "):
        capture._load_tp_target(llama_copy, torch.float32)


@pytest.mark.parametrize("named", [None, "/elsewhere/x"])
def test_a_regenerations_complaint_names_the_conversations_unless_it_names_a_file(random_llama, tmp_path,
                                                                                  monkeypatch, named):
    def refuse(*args, **kwargs):
        raise LabError("the answer ran out", named)

    monkeypatch.setattr(capture, "regenerate", refuse)
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    with pytest.raises(LabError) as e:
        capture.prepare_features(random_llama, convs, tmp_path / "out", max_length=64, regenerate=True)
    assert str(e.value) == f"{named or convs}: the answer ran out"
