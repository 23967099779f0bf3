"""Review (s73, h6) of train/sources.py, the gaps a mutation audit found: features as wide as another
target are refused, a held-out feature set's own sampling temperature is the validation's (captured
and online), an online run scans, identifies and describes a held-out feature set, and keeps the aux
layers it was asked for; its capture settings are checked first, and the encoded hash is stable."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from drafter_lab import atomic
from drafter_lab.data.capture import CaptureConfig
from drafter_lab.data.capture_config import ENCODED_HASH
from drafter_lab.data.shards import Manifest
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target_head
from drafter_lab.train.sources import Captured, Online, Prompt, encoded_sha256

CAPTURE = CaptureConfig(max_length=96, val_fraction=0.25)  # as the `features` fixture was captured


def _edited(src, dst, edit):
    """A copy of the feature directory `src` whose manifest.json `edit` changed in place."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    edit(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_features_of_another_hidden_size_are_refused(peaked_llama, features, tmp_path):
    head = load_target_head(peaked_llama)
    wide = _edited(features, tmp_path / "wide", lambda m: m["target"].update(hidden_size=head.hidden_size + 8))
    with pytest.raises(LabError) as e:
        Captured(peaked_llama, wide, scan=False, target=head)
    assert str(e.value) == (f"{wide}: features have hidden size {head.hidden_size + 8}, the target "
                            f"{head.hidden_size}: they do not fit")


def test_a_held_out_feature_sets_sampling_temperature_is_the_validations(peaked_llama, features, held_out, tmp_path):
    """The validation replays what its own sequences were sampled at, not what the training data was."""
    sampled = _edited(held_out[1], tmp_path / "val", lambda m: m["source"].update(sampled_at=0.7))
    head = load_target_head(peaked_llama)
    assert Captured(peaked_llama, features, scan=False, target=head).val_sampled_at is None
    captured = Captured(peaked_llama, features, scan=False, target=head, val_data=sampled)
    assert captured.val_sampled_at == 0.7
    assert captured.describe() == {"dir": str(features), "val_data": str(sampled)}
    assert captured.identity()["val"] == {"manifest_sha256": atomic.sha256_file(sampled / "manifest.json")}
    convs = Manifest.load(features).source["conversations"]
    online = Online(peaked_llama, convs, CAPTURE, torch.device("cpu"), val_data=sampled, scan=False)
    assert online.val_sampled_at == 0.7
    assert online.reads["val"] is None and online.items["val"] == online.held_out.items  # read from the shards
    # What a resume must match: the train sequences' encoding, and the held-out set by its manifest.
    identity = online.identity()
    assert identity["val"] == {"manifest_sha256": atomic.sha256_file(sampled / "manifest.json")}
    assert identity[ENCODED_HASH] == encoded_sha256(online.items["train"])
    assert online.describe()["val_data"] == str(sampled)


def test_an_online_run_scans_its_held_out_feature_set(peaked_llama, features, out_of_vocab_held_out):
    bad, shard = out_of_vocab_held_out
    convs = Manifest.load(features).source["conversations"]
    with pytest.raises(LabError, match="token id 999999 outside the target vocab") as e:
        Online(peaked_llama, convs, CAPTURE, torch.device("cpu"), val_data=bad)
    assert e.value.path == str(shard)
    Online(peaked_llama, convs, CAPTURE, torch.device("cpu"), val_data=bad, scan=False)  # refused per batch later


def test_an_online_runs_capture_settings_are_checked_before_the_target_loads(features):
    convs = Manifest.load(features).source["conversations"]
    with pytest.raises(LabError, match="unknown dtype 'fp4'"):
        Online(features / "no-target", convs, CaptureConfig(dtype="fp4"), torch.device("cpu"))


def test_an_online_run_keeps_the_aux_layers_it_was_asked_for(peaked_llama, features):
    convs = Manifest.load(features).source["conversations"]
    capture = CaptureConfig(max_length=96, val_fraction=0.25, aux_layer_ids=[1, 3, 6])
    online = Online(peaked_llama, convs, capture, torch.device("cpu"))
    assert online.aux_layer_ids == [1, 3, 6] and online.identity()["aux_layer_ids"] == [1, 3, 6]
    assert online.describe() == {"online": str(convs), "skipped": online.skipped}  # no held-out set to name


def test_the_encoded_hash_is_the_one_runs_recorded():
    """run.json keeps it and a resume (or the watch, across runs) compares it with the one computed now:
    the same sequences must hash as they did when the run was recorded."""
    prompts = [Prompt("a", torch.tensor([1, 2]), torch.tensor([True, False])),
               Prompt("b", torch.tensor([3]), torch.tensor([True]))]
    assert encoded_sha256(prompts) == "efb91ab27bcddb8d"
