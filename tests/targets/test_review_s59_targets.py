"""Inputs that ended in a traceback instead of one line: a target path that is a file (the fingerprint,
which torchrun's capture takes first), and a drift whose fine-tune step count overflows."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from drafter_lab import cli
from drafter_lab.errors import LabError
from drafter_lab.targets import build as build_mod
from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint


@pytest.mark.parametrize("name", [fingerprint, legacy_fingerprint])
def test_a_file_given_for_the_model_directory_is_one_line(tmp_path, name):
    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(4)}, weights)
    with pytest.raises(LabError, match="is a file, not a model directory"):  # was NotADirectoryError
        name(weights)


def test_a_config_json_that_is_a_directory_is_one_line(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(LabError, match="cannot read config.json"):  # was IsADirectoryError
        fingerprint(tmp_path)


def test_capture_under_torchrun_with_a_file_for_the_target_is_one_line(tmp_path):
    from drafter_lab.data.capture import _load_tp_target

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(LabError, match="is a file, not a model directory"):
        _load_tp_target(tmp_path / "config.json", torch.float32)


def test_a_drift_past_any_step_count_is_refused_before_base_trains(tmp_path, capsys, monkeypatch):
    """round(1e308 * tune_steps) raised OverflowError after base was trained and cached."""
    def trained(*args, **kwargs):
        raise AssertionError("train_lm ran: the drift should have been refused first")

    monkeypatch.setattr(build_mod, "train_lm", trained)
    argv = ["targets", "build", "--preset", "micro", "--out", str(tmp_path / "pair"),
            "--cache-dir", str(tmp_path / "cache"), "--drift", "1e308"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --drift 1e+308 x tune_steps 6 is past any number of fine-tune steps")
    assert not (tmp_path / "pair").exists()
