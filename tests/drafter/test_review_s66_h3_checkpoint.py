"""Mutation audit (review s66, h3) of drafter/checkpoint.py: the file a refusal names (a grown
draft_vocab_size read by read_vocab, a bad d2t in a shard), a non-zero fc.bias, a head-less drafter
served beside a resized target, load_drafter's embedding precedence, and export's refusals of a zero
draft length and of a run record whose config is no object."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import (
    export,
    load_drafter,
    read_checkpoint,
    read_vocab,
    save_drafter,
    served_with_vocab,
)
from drafter_lab.errors import LabError

from .test_formats import _foreign, _serving_target, _whole_vocab_drafter
from .test_model import random_drafter, small_config


def _edit_config(path, **over):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **over}))


def test_read_vocab_names_config_json_for_a_grown_draft_vocab_size(saved):
    """A d2t shorter than the config says is config.json's line too (not the weights file's), as a longer one is."""
    path, _ = saved
    _edit_config(path, draft_vocab_size=38)
    with pytest.raises(LabError) as e:
        read_vocab(path)
    assert str(e.value) == f"{path / 'config.json'}: d2t has 37 entries, the config's draft_vocab_size is 38"


def test_a_bad_d2t_in_a_shard_names_that_shard(saved):
    """Sharded: the refusal of d2t names the shard that holds it, not the directory."""
    path, state = saved
    (path / "model.safetensors").unlink()
    parts = {"model-00001-of-00002.safetensors": [k for k in state if k != "d2t"],
             "model-00002-of-00002.safetensors": ["d2t"]}
    state["d2t"] = state["d2t"].float()
    for file, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(path / file))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: file for file, keys in parts.items() for k in keys}}))
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path / 'model-00002-of-00002.safetensors'}: d2t must be a 1-D integer tensor, "
                            "got torch.float32 [37]")


def test_a_non_zero_fc_bias_is_refused_as_a_bias_fc_does_not_have(saved):
    path, state = saved
    save_file({**state, "fc.bias": torch.ones(48)}, str(path / "model.safetensors"))
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path / 'model.safetensors'}: fc.bias is non-zero: this drafter's fc has no bias"


def test_a_drafter_sharing_its_targets_head_is_refused_beside_a_resized_target(tmp_path):
    """Its head is its target's, of the old size's rows: one line, not a shape error when it is built."""
    drafter = _whole_vocab_drafter()
    d = _foreign(tmp_path, drafter, "shared", lambda k: k, formats.sglang_config(drafter.config, torch.float32, False),
                 drop=("lm_head.weight",))
    with pytest.raises(LabError) as e:
        served_with_vocab(read_checkpoint(d), 111)
    assert str(e.value) == (f"{d}: the drafter was trained for a 101-token target, this one has 111: it drafts over "
                            "its target's whole vocabulary with its target's lm_head")


def test_an_embedding_passed_to_load_drafter_wins_over_the_targets(saved):
    path, _ = saved
    cfg = read_checkpoint(path).config
    target = _serving_target(cfg)
    mine = torch.randn(cfg.target_vocab_size, cfg.hidden_size)
    drafter = load_drafter(path, target=target, embed_weight=mine)
    assert torch.equal(drafter.embed_tokens.weight, mine)
    assert torch.equal(load_drafter(path, target=target).embed_tokens.weight, target.embed_weight())


def test_a_speculators_export_of_zero_draft_tokens_is_refused(saved, tmp_path):
    """0 is falsy: unrefused, it would silently become the default 5 in vLLM's config."""
    path, _ = saved
    with pytest.raises(LabError, match="^speculative_tokens must be at least 1, got 0$"):
        export(path, formats.SPECULATORS, tmp_path / "out", speculative_tokens=0)
    assert not (tmp_path / "out").exists()


def test_a_run_record_whose_config_is_not_an_object_is_one_line(saved, tmp_path):
    path, _ = saved
    (path / "run.json").write_text(json.dumps({"config": [], "target": {}}))
    with pytest.raises(LabError) as e:
        export(path, formats.SPECULATORS, tmp_path / "out")
    assert str(e.value) == f"{path / 'run.json'}: not a run record (a JSON object with config and target objects)"


def test_a_tensor_of_another_shape_in_a_shard_is_said_to_be_in_that_shard(saved):
    path, state = saved
    (path / "model.safetensors").unlink()
    parts = {"model-00001-of-00002.safetensors": [k for k in state if k != "fc.weight"],
             "model-00002-of-00002.safetensors": ["fc.weight"]}
    state["fc.weight"] = state["fc.weight"][:, :100].clone()
    for file, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(path / file))
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path / 'config.json'}: tensor 'fc.weight' has shape (48, 100) in "
                            "model-00002-of-00002.safetensors, the config's sizes give (48, 120)")


def test_an_lm_head_of_another_row_count_names_its_weights_file(saved):
    path, state = saved
    save_file({**state, "lm_head.weight": state["lm_head.weight"][:36].clone()}, str(path / "model.safetensors"))
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path / 'model.safetensors'}: tensor 'lm_head.weight' has 36 rows, the config's "
                            "draft_vocab_size is 37")


def test_sizes_after_a_tensor_the_file_leaves_out_are_still_checked(saved):
    """An EAGLE release without its embedding, its config's intermediate_size edited: config.json's line
    when read, not a shape error from load (or an allocation of the edited size)."""
    path, state = saved
    save_file({k: v for k, v in state.items() if k != "embed_tokens.weight"}, str(path / "model.safetensors"))
    _edit_config(path, intermediate_size=8000)
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path / 'config.json'}: tensor 'midlayer.mlp.gate_proj.weight' has shape (80, 48) in "
                            "model.safetensors, the config's sizes give (8000, 48)")


def test_a_drafter_served_beside_a_larger_target_records_its_size_and_marks_its_tokens(tmp_path):
    """A version that added tokens (101 -> 150): the size recorded and t2d rebuilt over it, the same tokens marked."""
    path = save_drafter(random_drafter(small_config(target_hidden_size=48), seed=6, dtype=torch.float32), tmp_path / "d")
    ckpt = read_checkpoint(path)
    used = ckpt.tensors["d2t"] + torch.arange(37)
    served = served_with_vocab(ckpt, 150)
    assert served.config.target_vocab_size == 150 and ckpt.config.target_vocab_size == 101
    assert served.tensors["t2d"].shape == (150,) and torch.equal(torch.nonzero(served.tensors["t2d"]).flatten(), used)
    drafter = load_drafter(path, vocab_size=150, embed_weight=torch.zeros(150, 48))
    assert torch.equal(drafter.t2d, served.tensors["t2d"])


@pytest.mark.parametrize("target_hidden, why", [
    (48, "pass the target, whose embedding it uses"),
    (40, "its hidden size differs from its target's, so the embedding is its own")])
def test_a_drafter_without_its_embedding_loaded_without_a_target_says_why_it_needs_one(tmp_path, target_hidden, why):
    drafter = random_drafter(small_config(target_hidden_size=target_hidden), seed=6, dtype=torch.float32)
    path = save_drafter(drafter, tmp_path / "d", embed=False)
    with pytest.raises(LabError) as e:
        load_drafter(path)
    assert str(e.value) == f"{path / 'model.safetensors'}: checkpoint lacks tensor 'embed_tokens.weight' ({why})"


@pytest.mark.parametrize("fmt", [formats.SGLANG, formats.SPECULATORS])
def test_an_export_of_a_drafter_without_its_embedding_leaves_it_out(saved, tmp_path, fmt):
    """The zeros that stand in for it while it is rewritten are not written."""
    path, state = saved
    save_file({k: v for k, v in state.items() if k != "embed_tokens.weight"}, str(path / "model.safetensors"))
    out = export(path, fmt, tmp_path / "out")
    names = {formats.canonical_name(k) for k in load_file(str(out / "model.safetensors"))}
    assert "embed_tokens.weight" not in names and "fc.weight" in names


def test_a_bin_that_holds_no_state_dict_is_one_line(saved):
    path, state = saved
    (path / "model.safetensors").unlink()
    torch.save(list(state.values()), path / "pytorch_model.bin")
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path / 'pytorch_model.bin'}: weights file does not hold a state dict"


def test_a_directory_that_holds_no_drafter_is_one_line_naming_it(tmp_path):
    missing, empty, config_only = tmp_path / "none", tmp_path / "empty", tmp_path / "config-only"
    empty.mkdir()
    config_only.mkdir()
    save_drafter(random_drafter(small_config(), seed=5, dtype=torch.float32), tmp_path / "d")
    (config_only / "config.json").write_text((tmp_path / "d" / "config.json").read_text())
    for path, line in ((missing, "drafter checkpoint directory not found"),
                       (empty, "not a drafter checkpoint: config.json is missing"),
                       (config_only, "no weights file (*.safetensors or pytorch_model.bin)")):
        with pytest.raises(LabError) as e:
            read_checkpoint(path)
        assert str(e.value) == f"{path}: {line}"
    with pytest.raises(LabError) as e:  # a path that is no directory is a vocab file's
        read_vocab(missing)
    assert str(e.value) == f"{missing}: draft vocabulary file not found"


def test_an_integer_embedding_is_refused(saved):
    """Else load casts it to float and drafts from an embedding of whole numbers."""
    path, state = saved
    save_file({**state, "embed_tokens.weight": state["embed_tokens.weight"].long()}, str(path / "model.safetensors"))
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path / 'model.safetensors'}: tensor 'embed_tokens.weight' is torch.int64, not a "
                            "floating-point weight")


@pytest.mark.parametrize("prefix, drop", [("module.model.", "module."), ("module._orig_mod.", "module._orig_mod.")])
def test_a_prefix_is_named_as_the_part_to_drop(saved, prefix, drop):
    """`module.model.fc.weight`: the lab reads `model.fc.weight`, so only `module.` is to be dropped. DDP over
    torch.compile saves `module._orig_mod.fc.weight`: the hint names both parts."""
    path, state = saved
    save_file({f"{prefix}{k}": v for k, v in state.items()}, str(path / "model.safetensors"))
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value).endswith(f"checkpoint lacks tensor 'fc.weight' (it holds '{prefix}fc.weight': save the "
                                 f"drafter's own state dict, without the '{drop}' prefix)")


def test_a_shard_index_without_a_weight_map_is_passed_over(saved):
    path, _ = saved
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}}))
    assert read_checkpoint(path).has_head


def test_a_speculators_drafter_lacking_a_midlayer_tensor_names_it_as_its_file_would(tmp_path):
    drafter = random_drafter(small_config(), seed=5, dtype=torch.float32)
    path = save_drafter(drafter, tmp_path / "d", formats.SPECULATORS)
    state = load_file(str(path / "model.safetensors"))
    del state["layers.0.mlp.up_proj.weight"]
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path / 'model.safetensors'}: checkpoint lacks tensor 'layers.0.mlp.up_proj.weight'"


def test_a_drafter_with_its_own_embedding_beside_a_resized_target_is_one_line_naming_it(saved):
    path, _ = saved
    with pytest.raises(LabError) as e:
        served_with_vocab(read_checkpoint(path), 120)
    assert str(e.value) == (f"{path}: the drafter was trained for a 101-token target, this one has 120: it embeds with "
                            "its own 101-row matrix, which the new ids run past")


def test_a_target_head_of_another_width_names_the_drafters_weights_file(tmp_path):
    drafter = _whole_vocab_drafter()
    d = _foreign(tmp_path, drafter, "shared", lambda k: k, formats.sglang_config(drafter.config, torch.float32, False),
                 drop=("lm_head.weight",))
    narrow = SimpleNamespace(hidden_size=40, embed_weight=None, lm_head_weight=lambda: torch.zeros(101, 40))
    with pytest.raises(LabError) as e:
        load_drafter(d, target=narrow, embed_weight=torch.zeros(101, 48))
    assert str(e.value) == (f"{d / 'model.safetensors'}: the drafter shares its target's lm_head, but the target's is "
                            "40 wide and the drafter's hidden size is 48")
