"""Mutation audit (review s64) of drafter/checkpoint.py: which files a drafter directory is read from, what a
`.bin` may hold beside its weights, the lines a bad directory or run record gets, serving beside a target of
another vocabulary size, load_drafter's dtype and export's output directory and verifier."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import (
    export,
    load_drafter,
    read_checkpoint,
    read_vocab,
    recorded_fingerprint,
    save_drafter,
    served_with_vocab,
)
from drafter_lab.errors import LabError

from .test_formats import _foreign, _serving_target, _whole_vocab_drafter
from .test_model import random_drafter, small_config


def _rewrite(path, state, name="model.safetensors"):
    (path / "model.safetensors").unlink()
    if name.endswith(".bin"):
        torch.save(state, path / name)
    else:
        save_file(state, str(path / name))


def test_a_bin_beside_the_safetensors_is_not_read(saved):
    """HF writes both forms of one model: the safetensors are read, the .bin (here garbage) is not."""
    path, state = saved
    (path / "pytorch_model.bin").write_bytes(b"not a pickle")
    assert torch.equal(read_checkpoint(path).tensors["fc.weight"], state["fc.weight"])


def test_read_vocab_reads_a_model_prefixed_d2t(saved):
    """read_vocab reads d2t and t2d alone by our names: a file that says `model.d2t` holds them too."""
    path, state = saved
    _rewrite(path, {f"model.{k}": v for k, v in state.items()})
    vocab = read_vocab(path)
    assert torch.equal(vocab.d2t, state["d2t"]) and torch.equal(vocab.t2d, state["t2d"])


def test_a_bin_holding_a_state_dict_under_state_dict_reads(saved):
    """A training framework's `{"state_dict": {...}, "epoch": 3}` save: its tensors are the drafter's."""
    path, state = saved
    _rewrite(path, {"state_dict": state, "epoch": 3}, "pytorch_model.bin")
    assert torch.equal(read_checkpoint(path).tensors["midlayer.mlp.up_proj.weight"], state["midlayer.mlp.up_proj.weight"])


def test_a_bin_with_non_tensor_entries_beside_the_weights_reads(saved):
    path, state = saved
    _rewrite(path, {**state, "step": 7, "note": "best"}, "pytorch_model.bin")
    assert set(read_checkpoint(path).tensors) == set(state)


def test_a_weights_file_given_for_its_directory_is_one_line(saved):
    path, _ = saved
    with pytest.raises(LabError) as e:
        read_checkpoint(path / "model.safetensors")
    assert str(e.value) == f"{path / 'model.safetensors'}: is a file, not a drafter directory: give the directory " \
                           "that holds it"


def _shard(path, state):
    """`state` split in two shards with their index (save_pretrained's names)."""
    names = sorted(state)
    parts = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
             "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    (path / "model.safetensors").unlink()
    for file, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(path / file))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: file for file, keys in parts.items() for k in keys}}))
    return parts


def test_a_sharded_drafter_lacking_a_tensor_names_its_directory(saved):
    """No shard holds it: the line names the directory, not the first shard (which was never to hold it)."""
    path, state = saved
    _shard(path, {k: v for k, v in state.items() if k != "norm.weight"})
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path}: checkpoint lacks tensor 'norm.weight'"


def test_a_stale_bin_index_beside_safetensors_is_not_checked(saved):
    """A .bin shard index left beside the safetensors that replaced its shards names files not read."""
    path, _ = saved
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {"fc.weight": "pytorch_model-00001-of-00002.bin"}}))
    assert read_checkpoint(path).has_head


def test_several_missing_shards_are_counted(saved):
    path, state = saved
    _shard(path, state)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "model-00003-of-00003.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path}: model.safetensors.index.json names shard model-00002-of-00002.safetensors and "
                            "1 more, which are missing: a save cut short or a partial download")


def test_a_d2t_of_two_dims_is_refused_for_its_shape(saved):
    """d2t and t2d are counted flat, so a [1, n] d2t is refused for its shape, not as a d2t of 1 entry."""
    path, state = saved
    _rewrite(path, {**state, "d2t": state["d2t"][None].clone()})
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path / 'model.safetensors'}: d2t must be a 1-D integer tensor, got torch.int64 [1, 37]"


def test_a_non_finite_verifier_head_is_carried_not_refused(saved):
    """The target's head a training framework saved beside the drafter is never loaded: NaN there is not the
    drafter's (its own weights are refused for one)."""
    path, state = saved
    _rewrite(path, {**state, "verifier_lm_head.weight": torch.full((4, 48), float("nan"))})
    assert read_checkpoint(path).tensors["verifier_lm_head.weight"].isnan().all()


def test_a_speculators_drafter_without_draft_vocab_size_gets_no_sglang_note(tmp_path, monkeypatch):
    """The note that SGLang would swap in its target's head is about SGLang's layout: a speculators
    config without draft_vocab_size (a whole-vocabulary drafter) is vLLM's, which keeps the file's head."""
    from drafter_lab.drafter import checkpoint

    drafter = _whole_vocab_drafter()
    config = formats.speculators_config(drafter.config, torch.float32)
    del config["draft_vocab_size"]
    d = _foreign(tmp_path, drafter, "sp", lambda k: formats.export_name(k, formats.SPECULATORS), config)
    lines = []
    monkeypatch.setattr(checkpoint, "log", lines.append)
    assert read_checkpoint(d).has_head and lines == []


def test_read_vocab_names_config_json_for_a_d2t_of_another_count(saved):
    """read_vocab checks the sizes against the config as read_checkpoint does: a hand-edited draft_vocab_size
    is config.json's line, not the weights file's."""
    path, _ = saved
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 36}))
    with pytest.raises(LabError) as e:
        read_vocab(path)
    assert str(e.value) == f"{path / 'config.json'}: d2t has 37 entries, the config's draft_vocab_size is 36"


def test_a_drafter_sharing_its_targets_head_serves_beside_a_target_of_its_own_size(tmp_path):
    """vocab_size equal to the trained one changes nothing: a head-less drafter is not refused as if resized."""
    drafter = _whole_vocab_drafter()
    d = _foreign(tmp_path, drafter, "shared", lambda k: k, formats.sglang_config(drafter.config, torch.float32, False),
                 drop=("lm_head.weight",))
    target = _serving_target(drafter.config)
    back = load_drafter(d, target=target, vocab_size=drafter.config.target_vocab_size)
    assert torch.equal(back.lm_head.weight, target.lm_head_weight())


def test_a_draft_token_at_the_new_targets_size_is_past_it(tmp_path):
    """A target of V tokens has ids 0..V-1: a draft token naming id V is refused in one line, V + 1 serves."""
    drafter = random_drafter(small_config(target_hidden_size=48), seed=6, dtype=torch.float32)
    top = int((drafter.d2t + torch.arange(37)).max())
    save_drafter(drafter, tmp_path / "d")
    ckpt = read_checkpoint(tmp_path / "d")
    with pytest.raises(LabError) as e:
        served_with_vocab(ckpt, top)
    assert str(e.value) == (f"{tmp_path / 'd'}: the drafter was trained for a 101-token target, this one has {top}: "
                            f"its draft tokens name target ids up to {top}")
    served = served_with_vocab(ckpt, top + 1)
    assert served.config.target_vocab_size == top + 1 and int(served.tensors["t2d"].sum()) == 37


def test_load_drafter_casts_every_weight_to_the_dtype_asked(saved):
    """The weights in `dtype` whatever the file holds; the token maps stay integer and bool."""
    path, state = saved
    _rewrite(path, {k: v.bfloat16() if v.is_floating_point() else v for k, v in state.items()})
    drafter = load_drafter(path)
    assert {p.dtype for p in drafter.parameters()} == {torch.float32}
    assert (drafter.d2t.dtype, drafter.t2d.dtype) == (torch.int64, torch.bool)
    assert {p.dtype for p in load_drafter(path, dtype=torch.float64).parameters()} == {torch.float64}


def test_a_loaded_drafter_trains_all_but_its_embedding(saved):
    """The embedding is the target's, frozen as EAGLE-3 trains it; every other weight trains on."""
    drafter = load_drafter(saved[0])
    assert [n for n, p in drafter.named_parameters() if not p.requires_grad] == ["embed_tokens.weight"]


def test_an_export_verifier_of_blanks_is_refused(saved, tmp_path):
    path, _ = saved
    with pytest.raises(LabError) as e:
        export(path, formats.SPECULATORS, tmp_path / "out", verifier="  ")
    assert str(e.value) == "--verifier is empty: give the target's name or path, or leave it out"


def test_an_export_fills_an_existing_empty_directory(saved, tmp_path):
    path, state = saved
    (tmp_path / "out").mkdir()
    export(path, formats.SGLANG, tmp_path / "out")
    assert torch.equal(load_file(str(tmp_path / "out/model.safetensors"))["fc.weight"], state["fc.weight"])


def test_a_run_record_whose_target_is_not_an_object_is_refused(saved):
    path, _ = saved
    (path / "run.json").write_text('{"config": {}, "target": "llama"}')
    with pytest.raises(LabError) as e:
        recorded_fingerprint(path)
    assert str(e.value) == f"{path / 'run.json'}: not a run record (a JSON object with config and target objects)"


def test_a_run_record_depth_of_true_does_not_reach_the_speculators_config(saved, tmp_path):
    """JSON's true is a Python int (1): refused, not exported as a draft length of 1."""
    path, _ = saved
    (path / "run.json").write_text('{"config": {"ttt_steps": true}, "target": {}}')
    with pytest.raises(LabError) as e:
        export(path, formats.SPECULATORS, tmp_path / "out")
    assert str(e.value) == f"{path / 'run.json'}: 'ttt_steps' is True, not a positive integer"
