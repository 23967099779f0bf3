"""Pairing checks (second audit): recorded aux layers are kept, a drafter path given as text is named
as every other error about it names it, and a drafter trained on another target is refused unless allowed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.errors import LabError
from drafter_lab.spec.pairing import check_pair, load_for_target


def test_check_pair_keeps_the_aux_layers_a_drafter_recorded():
    """Only a drafter without aux layer ids gets the default; recorded ones are what it was trained on."""
    target = SimpleNamespace(vocab_size=10, hidden_size=4, num_layers=6)
    cfg = SimpleNamespace(target_vocab_size=10, target_hidden_size=4, aux_layer_ids=[0, 1, 5])
    drafter = SimpleNamespace(config=cfg, t2d=torch.ones(10, dtype=torch.bool), d2t=torch.zeros(3, dtype=torch.long),
                              fc=SimpleNamespace(weight=torch.zeros(4, 12)))
    check_pair(target, drafter, "d/")
    assert drafter.config.aux_layer_ids == [0, 1, 5]


def test_a_drafter_path_given_as_text_is_named_as_its_other_errors_name_it(random_drafter, tmp_path):
    """The checkpoint readers name `d/` as the Path `d`; the pairing refusals must too."""
    save_drafter(random_drafter, tmp_path / "d")
    target = SimpleNamespace(vocab_size=random_drafter.config.target_vocab_size, hidden_size=7, num_layers=8)
    with pytest.raises(LabError, match="drafter hidden size does not fit") as e:
        load_for_target(f"{tmp_path / 'd'}/", target)
    assert e.value.path == str(tmp_path / "d")


def test_a_drafter_trained_on_another_target_is_refused_unless_allowed(target, random_drafter, tmp_path):
    out = save_drafter(random_drafter, tmp_path / "d")
    (out / "run.json").write_text(json.dumps({"target": {"fingerprint": "f00"}}))
    with pytest.raises(LabError, match=r"drafter was trained on target f00, not on .*pass --allow-other-target") as e:
        load_for_target(out, target)
    assert e.value.path == str(out)
    assert load_for_target(out, target, allow_other_target=True).config == random_drafter.config
    (out / "run.json").write_text(json.dumps({"target": {"fingerprint": target.fingerprint}}))
    assert not load_for_target(out, target).training  # its own target's drafter loads, in eval mode
