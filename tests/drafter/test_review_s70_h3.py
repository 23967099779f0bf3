"""Review s70 (h3): a drafter's pytorch_model.bin as training scripts save it. SGLang and vLLM read a flat state
dict only; the lab also unwraps one nesting a training script leaves (`{"module": sd, ...}` of DeepSpeed,
`{"model": sd}`, `{"model_state_dict": sd}`, Lightning's `{"state_dict": sd}`) where only one entry can be the
drafter, and refuses any other layout, a pickled object weights_only does not load, a weights file that is a
dangling link, or shard indexes whose every shard is lost, in one line naming the file."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from drafter_lab.drafter.checkpoint import load_drafter, read_checkpoint, read_config, read_vocab
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config

BIN = "pytorch_model.bin"


def _as_bin(path, payload):
    """The saved drafter's weights replaced by a torch.save of `payload` (the config stays)."""
    (path / "model.safetensors").unlink()
    torch.save(payload, path / BIN)
    return path / BIN


def _refusal(path) -> str:
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    return str(e.value)


@pytest.mark.parametrize("key", ["state_dict", "model_state_dict", "model", "module"])
def test_a_state_dict_nested_under_a_training_scripts_key_loads(saved, key):
    """Beside it what such a save holds too: the step and the optimizer's state (tensors, one level further down)."""
    path, state = saved
    drafter = random_drafter(small_config(), seed=5, dtype=torch.float32)
    opt = torch.optim.AdamW(drafter.parameters())
    drafter.fc.weight.sum().backward()
    opt.step()
    _as_bin(path, {key: state, "optimizer": opt.state_dict(), "global_step": 3})
    loaded = load_drafter(path)
    for name, t in loaded.state_dict().items():
        assert torch.equal(t, state[name].to(t.dtype)), name
    vocab = read_vocab(path)  # d2t and t2d alone, from under the same key
    assert torch.equal(vocab.d2t, state["d2t"]) and torch.equal(vocab.t2d, state["t2d"])


def test_a_nested_state_dict_with_model_prefixed_names_loads(saved):
    path, state = saved
    _as_bin(path, {"module": {f"model.{k}": v for k, v in state.items()}})
    assert torch.equal(read_checkpoint(path).tensors["midlayer.self_attn.q_proj.weight"],
                       state["midlayer.self_attn.q_proj.weight"])


def test_two_state_dicts_under_known_keys_are_refused(saved):
    """An EMA copy beside the trained weights, say: which one the user means is a guess."""
    path, state = saved
    f = _as_bin(path, {"model": state, "module": {k: v + 1 for k, v in state.items()}})
    assert _refusal(path) == f"{f}: weights file holds tensors under 'model' and 'module': which is the drafter " \
                             "is a guess; save its state dict alone"


def test_a_flat_state_dict_beside_a_nested_one_is_refused(saved):
    path, state = saved
    f = _as_bin(path, {**state, "state_dict": dict(state)})
    assert _refusal(path) == f"{f}: weights file holds tensors under its top level and 'state_dict': which is " \
                             "the drafter is a guess; save its state dict alone"


@pytest.mark.parametrize("payload, keys", [
    (lambda sd: {}, "none"),
    (lambda sd: {"model": {"module": sd}, "epoch": 2}, "'model', 'epoch'"),  # two levels down: not read
    (lambda sd: {f"k{i}": i for i in range(5)}, "'k0', 'k1', 'k2', 'k3', 'k4'"),
    (lambda sd: {f"k{i}": i for i in range(6)}, "'k0', 'k1', 'k2', 'k3', 'k4', ..."),  # the first five named
    (lambda sd: {"weights": sd}, "'weights'"),  # under a key no training script is known to use
])
def test_a_bin_without_a_state_dict_where_one_is_looked_for_is_one_line(saved, payload, keys):
    path, state = saved
    f = _as_bin(path, payload(state))
    assert _refusal(path) == f"{f}: weights file holds no tensors, neither at its top level nor under " \
                             f"'state_dict', 'model_state_dict', 'model', 'module' (its keys: {keys})"


class _Tripwire:
    """Records being unpickled: a file weights_only refuses must never be unpickled."""

    built = False

    def __init__(self):
        self.armed = True  # some state, so that unpickling calls __setstate__

    def __setstate__(self, state):
        _Tripwire.built = True


@pytest.mark.parametrize("extra, named", [
    (argparse.Namespace(lr=1e-4), "argparse.Namespace"),  # a training script's args beside its weights
    (_Tripwire(), f"{__name__}._Tripwire"),
])
def test_a_bin_with_pickled_objects_is_refused_unloaded(saved, extra, named):
    path, state = saved
    f = _as_bin(path, {"model": state, "args": extra})
    assert _refusal(path) == f"{f}: weights file holds a pickled {named}, which is not loaded (unpickling it " \
                             "could run code): save the drafter's state dict alone (torch.save(model.state_dict()))"
    assert not _Tripwire.built


def test_a_whole_pickled_drafter_is_refused(saved):
    """torch.save(drafter) instead of its state dict: torch's own line began with advice in terminal escapes."""
    path, _ = saved
    f = _as_bin(path, random_drafter(small_config(), seed=1, dtype=torch.float32))
    assert _refusal(path) == f"{f}: weights file holds a pickled drafter_lab.drafter.model.Eagle3Drafter, which is " \
                             "not loaded (unpickling it could run code): save the drafter's state dict alone " \
                             "(torch.save(model.state_dict()))"


@pytest.mark.parametrize("name", ["model.safetensors", BIN])
def test_a_weights_file_that_is_a_dangling_link_says_so(saved, tmp_path, name):
    """An HF cache whose blob was cleaned: "truncated or corrupt" sent the user to a file that is not there."""
    path, _ = saved
    (path / "model.safetensors").unlink()
    (path / name).symlink_to(tmp_path / "blobs" / "gone")
    assert _refusal(path) == f"{path / name}: weights file is a link to {tmp_path / 'blobs' / 'gone'}, which is " \
                             "missing (a cache cleaned, or a download cut short)"


def test_a_link_to_a_corrupt_weights_file_is_corrupt_not_missing(saved, tmp_path):
    """An HF cache's link to a blob a download cut short: the blob is there, and it is what is wrong."""
    path, _ = saved
    blob = tmp_path / "blobs" / "0a1b"
    blob.parent.mkdir()
    blob.write_bytes((path / "model.safetensors").read_bytes()[:100])
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").symlink_to(blob)
    assert _refusal(path).startswith(f"{path / 'model.safetensors'}: truncated or corrupt weights file (")


@pytest.mark.parametrize("index, shard", [("model.safetensors.index.json", "model-00001-of-00002.safetensors"),
                                          ("pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin")])
def test_an_index_whose_every_shard_is_lost_names_them(saved, index, shard):
    """Not "no weights file": the index says which files the download lost."""
    path, state = saved
    (path / "model.safetensors").unlink()
    (path / index).write_text(json.dumps({"weight_map": {k: shard for k in state} | {
        "lm_head.weight": shard.replace("00001", "00002")}}))
    assert _refusal(path) == f"{path}: {index} names shard {shard} and 1 more, which are missing: a save cut short " \
                             "or a partial download"


@pytest.mark.parametrize("nest", [lambda sd: sd, lambda sd: {"model": sd}])
def test_a_tensor_under_a_key_that_is_no_name_is_one_line(saved, nest):
    """weights_only loads an int key: reading it by name was an AttributeError traceback."""
    path, state = saved
    f = _as_bin(path, nest({**state, 7: torch.zeros(3)}))
    assert _refusal(path) == f"{f}: weights file holds a tensor under the key 7, not under a tensor name"
    with pytest.raises(LabError, match="under the key 7"):
        read_vocab(path)


def test_read_config_of_a_missing_directory_given_as_text_names_it(tmp_path):
    """The probe and the pairing check read a drafter's config alone, by the path the user typed."""
    missing = tmp_path / "none"
    with pytest.raises(LabError) as e:
        read_config(str(missing))
    assert str(e.value) == f"{missing}: drafter checkpoint directory not found"


def test_what_reading_filled_in_is_recorded(saved):
    """transfer reports a t2d the file left out as filled from d2t, not as the file's."""
    from safetensors.torch import save_file

    path, state = saved
    save_file({k: v for k, v in state.items() if k != "t2d"}, str(path / "model.safetensors"))
    ckpt = read_checkpoint(path)
    assert ckpt.filled == ("t2d",) and torch.equal(ckpt.tensors["t2d"], state["t2d"])


def test_read_vocab_of_a_drafter_directory_given_as_text(saved):
    """`vocab compare A B` passes the paths as typed."""
    path, state = saved
    vocab = read_vocab(str(path))
    assert torch.equal(vocab.d2t, state["d2t"]) and torch.equal(vocab.t2d, state["t2d"])
