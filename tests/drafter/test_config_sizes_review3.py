"""Hand-edited drafter config.json fields as a user meets them: an `architectures` of another JSON type,
sizes that the weights cannot have (refused before anything of that size is allocated), and numbers past
float's range. Each is one line naming config.json, not a traceback or an allocation of terabytes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.cli import main
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import load_drafter, read_vocab, save_drafter
from drafter_lab.drafter.model import Eagle3Drafter, state_shapes
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config

HUGE = 10**12


def _drafter(tmp_path, name, cfg=None, drop=(), **save) -> object:
    out = tmp_path / name
    save_drafter(random_drafter(cfg or small_config(), seed=3, dtype=torch.float32), out, formats.SGLANG, **save)
    if drop:
        state = load_file(str(out / "model.safetensors"))
        save_file({k: v for k, v in state.items() if k not in drop}, str(out / "model.safetensors"))
    return out


def _edit(src, **fields):
    data = json.loads((src / "config.json").read_text())
    data.update(fields)
    (src / "config.json").write_text(json.dumps(data))


def _export_error(src, out, capsys) -> str:
    capsys.readouterr()
    assert main(["export", "--drafter", str(src), "--format", "speculators", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not out.exists(), err
    return err[0]


@pytest.mark.parametrize("archs", [-1, True, 1.5])
def test_architectures_of_another_json_type_is_one_line(tmp_path, capsys, archs):
    src = _drafter(tmp_path, "src")
    _edit(src, architectures=archs)
    assert _export_error(src, tmp_path / "out", capsys) == \
        f"error: {src / 'config.json'}: config's 'architectures' is {archs!r}, not a list of class names"


@pytest.mark.parametrize("key", ["hidden_size", "head_dim", "intermediate_size", "target_hidden_size",
                                 "num_attention_heads", "vocab_size", "draft_vocab_size"])
def test_a_size_the_weights_do_not_have_is_refused_before_it_is_built(tmp_path, capsys, key):
    """Checked against the file's tensors (export built a [vocab, hidden] zeros and the whole model on the
    CPU first, load_drafter the model: an allocator traceback); a vocabulary no tensor of the file holds
    (a whole-vocabulary drafter sharing its target's embedding and head) against 32-bit token ids."""
    full = _drafter(tmp_path, "full")
    _edit(full, **{key: HUGE})
    err = _export_error(full, tmp_path / "out", capsys)
    assert err.startswith(f"error: {full / 'config.json'}: ") and "000000000000" in err  # HUGE, or a product
    with pytest.raises(LabError, match="000000000000"):
        load_drafter(full)
    if key in ("vocab_size", "draft_vocab_size"):
        whole = _drafter(tmp_path, "whole", small_config(draft_vocab_size=101, target_hidden_size=48),
                         drop=("d2t", "t2d"), embed=False, head=False)
        _edit(whole, vocab_size=HUGE)  # draft_vocab_size is null there: the target's
        assert _export_error(whole, tmp_path / "out", capsys) == \
            f"error: {whole / 'config.json'}: config's 'vocab_size' is {HUGE}, past the 32-bit token ids of " \
            "tokenizers and engines"
        with pytest.raises(LabError, match="past the 32-bit token ids"):
            read_vocab(whole)  # `vocab compare`


def test_state_shapes_are_the_modules(tmp_path):
    for cfg in (small_config(), small_config(target_hidden_size=48, num_key_value_heads=4)):
        shapes = {k: tuple(v.shape) for k, v in Eagle3Drafter(cfg).state_dict().items()}
        assert state_shapes(cfg) == shapes and list(state_shapes(cfg)) == list(shapes)


@pytest.mark.parametrize("fields", [{"rope_theta": 10**400}, {"rms_norm_eps": 10**400},
                                    {"rope_scaling": {"type": "linear", "factor": 10**400}}])
def test_a_number_past_floats_range_is_one_line(tmp_path, capsys, fields):
    """JSON allows any integer; float() of one past 1e308 raised an OverflowError."""
    src = _drafter(tmp_path, "src")
    _edit(src, **fields)
    err = _export_error(src, tmp_path / "out", capsys)
    assert err.startswith(f"error: {src / 'config.json'}: ") and ("not a positive number" in err
                                                                   or "is not a finite number" in err)


def test_a_draft_vocab_larger_than_its_vocab_is_one_line(tmp_path, capsys):
    """A draft vocabulary is a subset of the target's; the whole-vocabulary case said it was "smaller"."""
    src = _drafter(tmp_path, "src")
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    _edit(src, draft_vocab_size=vocab + 1)
    assert _export_error(src, tmp_path / "out", capsys) == \
        f"error: {src / 'config.json'}: config's draft_vocab_size {vocab + 1} is larger than its vocab_size " \
        f"{vocab}: a draft vocabulary is a subset of the target's"
