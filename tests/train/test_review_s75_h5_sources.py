"""Review (s75, h5): a held-out set given as a str path (`val_data`) is taken as a Path, as train() and the
training data's own argument take it; before, an online run and a captured one met it with an AttributeError
(and a captured run on a str `data_dir` with a TypeError)."""

from __future__ import annotations

import shutil

import pytest
import torch

from drafter_lab.data.capture import CaptureConfig
from drafter_lab.data.shards import Manifest
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target_head
from drafter_lab.train.sources import Captured, Online

CAPTURE = CaptureConfig(max_length=96, val_fraction=0.25)


def test_an_online_run_refuses_a_copy_of_its_conversations_given_as_a_str(peaked_llama, features, tmp_path):
    convs = Manifest.load(features).source["conversations"]
    copy = tmp_path / "copy.jsonl"
    shutil.copy(convs, copy)
    with pytest.raises(LabError) as e:
        Online(peaked_llama, convs, CAPTURE, torch.device("cpu"), val_data=str(copy))
    assert str(e.value) == (f"{copy}: --val-data holds the same conversations as --conversations: validation would "
                            "score what the drafter trains on")


def test_a_captured_run_takes_str_paths_as_paths(peaked_llama, features, held_out, tmp_path):
    head = load_target_head(peaked_llama)
    held = Captured(peaked_llama, str(features), scan=False, target=head, val_data=str(held_out[1]))
    assert held.describe() == Captured(peaked_llama, features, scan=False, target=head,
                                       val_data=held_out[1]).describe()
    copy = tmp_path / "copy"
    shutil.copytree(features, copy)
    with pytest.raises(LabError, match=r"--val-data holds the same features as --data") as e:
        Captured(peaked_llama, str(features), scan=False, target=head, val_data=str(copy))
    assert e.value.path == str(copy)
    with pytest.raises(LabError, match=r"validates on a feature directory, not a file"):
        Captured(peaked_llama, features, scan=False, target=head, val_data=str(held_out[0]))
