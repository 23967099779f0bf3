"""A damaged run directory is refused on --resume with a one-line error (review s70, h7)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=1, ttt_steps=1, warmup_steps=0, threads=1)


@pytest.fixture(scope="module")
def held_run(peaked_llama, features, held_out, tmp_path_factory):
    """A finished run that validated on a --val-data of its own."""
    out = tmp_path_factory.mktemp("h7") / "held"
    train(CFG, peaked_llama, features, out, val_data=held_out[1])
    return out


@pytest.fixture
def copy(held_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(held_run, out)
    return out


def test_a_resume_whose_drafter_config_is_gone_is_refused(copy, peaked_llama, features, held_out):
    """Every checkpoint writes config.json before the train state, so a state without it is a damaged run
    directory: the resume went on unchecked against the drafter it would build."""
    (copy / "config.json").unlink()
    kept = state.state_path(copy).read_bytes()
    with pytest.raises(LabError, match=rf"^{re.escape(str(copy / 'config.json'))}: drafter config not found beside "
                                       r"the run's train state \(damaged run directory\)"):
        train(CFG, peaked_llama, features, copy, resume=True, val_data=held_out[1])
    assert state.state_path(copy).read_bytes() == kept and not (copy / "config.json").exists()


@pytest.mark.parametrize("features_value", [["x"], "x", 3])
def test_a_run_json_whose_features_are_no_object_still_names_the_validation_change(
        copy, peaked_llama, features, features_value):
    """A hand-edited run.json: its features' val_data was read with .get, an AttributeError; it is read as
    a run.json that cannot be read, and the resume without the run's --val-data is refused as ever."""
    info = json.loads((copy / "run.json").read_text())
    info["features"] = features_value
    (copy / "run.json").write_text(json.dumps(info))
    said = (f"{copy}: --resume with other validation data: the run validated on a --val-data of its own; this "
            "resume gives none: pass the --val-data it validated on")
    with pytest.raises(LabError, match=f"^{re.escape(said)}$"):
        train(CFG, peaked_llama, features, copy, resume=True)


def test_a_readable_run_json_names_the_validation_set(copy, peaked_llama, features, held_out):
    said = (f"--resume with other validation data: the run validated on --val-data {held_out[1]}; this resume "
            f"gives none: pass --val-data {held_out[1]}")
    with pytest.raises(LabError, match=re.escape(said)):
        train(CFG, peaked_llama, features, copy, resume=True)


def test_a_resume_on_features_of_other_aux_layers_names_the_data(copy, peaked_llama, features, held_out, tmp_path):
    """Another --data builds a drafter on other aux layers: the refusal blamed another lab version for it."""
    from drafter_lab.data.capture import prepare_features

    other = tmp_path / "other"
    prepare_features(peaked_llama, held_out[0], other, max_length=96, val_fraction=0.25, aux_layer_ids=[1, 3, 5])
    with pytest.raises(LabError, match=r"--resume with other training data \(manifest_sha256 "):
        train(CFG, peaked_llama, other, copy, resume=True)


def test_a_watched_run_on_other_batches_than_its_baseline_says_so(held_run, peaked_llama, features, held_out,
                                                                   tmp_path, capsys):
    """The constructor's note on what makes the two runs unequal is what the watch logs as it starts."""
    other = dataclasses.replace(CFG, batch_size=2)
    train(other, peaked_llama, features, tmp_path / "run", val_data=held_out[1], stop_if_behind=held_run)
    assert "watch: the runs' batches differ (batch_size 2 vs 4)" in capsys.readouterr().err


def test_a_pull_of_at_most_1_pulls_too(held_run, peaked_llama, features, tmp_path):
    """Any l2sp above 0 anchors the transferred weights (its pull acts from the second step on)."""
    from safetensors.torch import load_file

    two = dataclasses.replace(CFG, max_steps=2)
    for name, l2sp in (("free", 0.0), ("pulled", 1.0)):
        train(two, peaked_llama, features, tmp_path / name, init_from=held_run, l2sp=l2sp)
    free, pulled = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("free", "pulled"))
    assert not torch.equal(free["fc.weight"], pulled["fc.weight"])
