"""train() refuses transfer settings without init_from, as the CLI does: the library took them and silently
ignored them (no source, no transferred weight to pull or scale). One check (loop.check_transfer) for both."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig


@pytest.fixture
def no_run(monkeypatch):
    """train() with any start of a run failing the test: the refusal must come first."""
    from drafter_lab.train import loop

    def setup(*args, **kwargs):
        raise AssertionError("the run started: the transfer setting should have been refused first")

    monkeypatch.setattr(loop.distributed, "setup", setup)
    return loop.train


@pytest.mark.parametrize("over, message", [
    ({"l2sp": 0.5}, "--l2sp applies with --init-from"),
    ({"transfer_lr_scale": 0.1}, "--transfer-lr-scale applies with --init-from"),
    ({"remap": False}, "--no-remap applies with --init-from"),
    ({"source_target": "st"}, "--source-target applies with --init-from"),
    ({"l2sp": 0.5, "transfer_lr_scale": 2.0}, "--l2sp and --transfer-lr-scale apply with --init-from"),
])
def test_the_library_refuses_transfer_settings_without_init_from(tmp_path, no_run, over, message):
    with pytest.raises(LabError) as e:
        no_run(TrainConfig(), tmp_path / "t", tmp_path / "d", tmp_path / "o", **over)
    assert str(e.value) == message
    assert not (tmp_path / "o").exists()


def test_the_library_takes_the_neutral_values_without_init_from(tmp_path, no_run):
    """A library call cannot tell its defaults from values given: no pull and an unscaled rate pass (what a
    scratch arm of the study or pilot passes), and the run starts."""
    with pytest.raises(AssertionError, match="the run started"):
        no_run(TrainConfig(), tmp_path / "t", tmp_path / "d", tmp_path / "o", l2sp=0.0, transfer_lr_scale=1.0)


def test_the_cli_and_the_library_share_the_check():
    from drafter_lab.train.loop import check_transfer

    check_transfer(0.0, 1.0, True, None, init_from="src")
    check_transfer()  # nothing given, no source
    with pytest.raises(LabError, match="^--l2sp applies with --init-from$"):
        check_transfer(0.0)  # given at its default (the CLI's --l2sp 0): still meant to take effect
    with pytest.raises(LabError, match="l2sp and transfer_lr_scale must be >= 0, got 0.0 and -1"):
        check_transfer(None, -1, init_from="src")


def test_the_scratch_arms_pass_no_transfer_setting(monkeypatch, tmp_path):
    """The pilot's scratch arm took the transfer's learning-rate scale (ignored); now refused, so not passed."""
    from drafter_lab.experiments import pilot

    seen = {}

    def train(cfg, target_dir, data_dir, out, **kwargs):
        seen[out.name] = kwargs
        raise StopIteration  # enough: the arms' arguments are what is checked

    monkeypatch.setattr(pilot, "train", train)
    for name, transfer in dict(pilot.ARMS).items():  # one arm at a time: the fake run stops the pilot
        monkeypatch.setattr(pilot, "ARMS", {name: transfer})
        with pytest.raises(StopIteration):
            pilot.run_pilot("src", "t", "d", TrainConfig(), tmp_path, transfer_lr_scale=0.1, source_target="st")
    assert seen["scratch"]["init_from"] is None and seen["scratch"]["transfer_lr_scale"] == 1.0
    assert seen["scratch"]["source_target"] is None
    assert seen["transfer"]["transfer_lr_scale"] == 0.1


def test_the_studys_scratch_arm_passes_no_transfer_setting(monkeypatch, tmp_path):
    """seeds-finetune (transfer_lr_scale 0.1) passed the scale to the scratch arm too: now refused, so not passed."""
    from drafter_lab.experiments import study
    from drafter_lab.experiments.config import PRESETS

    seen = {}

    class Stop(Exception):
        pass

    def train(cfg, target_dir, data_dir, out, **kwargs):
        if out.parent.name != "arms":
            return {}  # the source drafter
        seen[out.name] = kwargs
        raise Stop  # enough: the arms' arguments are what is checked

    monkeypatch.setattr(study, "build_pair", lambda *a, **k: {})
    monkeypatch.setattr(study, "_features", lambda target_dir, *a: tmp_path / target_dir.name)
    monkeypatch.setattr(study, "probe", lambda *a, **k: {})
    monkeypatch.setattr(study, "train", train)
    cfg = PRESETS["seeds-finetune"]
    assert cfg.transfer_lr_scale != 1 and cfg.arms[0] == "a"
    with pytest.raises(Stop):
        study.run_level(cfg, 4.0, tmp_path / "level", tmp_path / "cache")
    assert seen["a"]["init_from"] is None and seen["a"]["transfer_lr_scale"] == 1.0
