"""The probe runs where --device says: every signal and the pilot (it ran its signals on the CPU alone, and
the pilot where its recipe said)."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.experiments import probe as probe_mod
from drafter_lab.experiments.probe import ProbeConfig, probe
from drafter_lab.train.config import TrainConfig


class _Piloted(Exception):
    pass


def test_the_pilot_trains_on_the_probes_device(source, random_llama, features, monkeypatch):
    def fake_pilot(drafter_dir, target_dir, data_dir, recipe, *rest):
        raise _Piloted(recipe.device)

    monkeypatch.setattr(probe_mod, "run_pilot", fake_pilot)
    cfg = ProbeConfig(max_sequences=4, pilot_steps=4, cka_tokens=32, ttt_steps=2, device="cpu")
    with pytest.raises(_Piloted, match="^cpu$"):
        probe(source, random_llama, features, cfg=cfg, pilot_recipe=TrainConfig(device="auto"))


def test_an_unknown_device_is_refused_before_anything_loads(tmp_path):
    # the directories do not exist: the device is checked first
    with pytest.raises(LabError, match="^unknown device 'tpu': use auto, cpu, cuda or cuda:N$"):
        probe(tmp_path / "d", tmp_path / "t", tmp_path / "f", cfg=ProbeConfig(device="tpu"))


def test_the_cli_takes_device(tmp_path, capsys):
    from drafter_lab.cli import main

    args = ["probe", "--drafter", str(tmp_path), "--target", str(tmp_path), "--data", str(tmp_path), "--device", "tpu"]
    assert main(args) != 0
    assert "unknown device 'tpu'" in capsys.readouterr().err
