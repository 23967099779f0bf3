"""`experiment --run-dir D` over a study made with another config: refused in one line before any stage runs
(it regenerated the data and ran the probe, minutes, then an arm refused "--resume with a different config"),
while the changes a resume can take still resume."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.cli import main
from drafter_lab.config import to_dict
from drafter_lab.errors import LabError
from drafter_lab.experiments import study
from drafter_lab.experiments.config import get_config


def _recorded(run_dir, cfg, device="cpu"):
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"config": to_dict(cfg), "device": {"type": device}}))


def test_a_run_dir_of_another_config_is_refused_before_any_stage(tmp_path, levels, capsys):
    run_dir = tmp_path / "runs" / "d"
    _recorded(run_dir, get_config("tiny-cpu"))
    assert main(["experiment", "--config", "smoke", "--run-dir", str(run_dir), "--cache", str(tmp_path / "c"),
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {run_dir}: holds a study made with another config (")
    assert "arm_steps" in err and "target_preset" in err and "name" not in err.split("(")[1].split(")")[0]
    assert "another --run-dir" in err and "--config tiny-cpu" in err
    assert levels == [] and not (tmp_path / "c").exists()


@pytest.mark.parametrize("change", [
    {},
    {"threads": 0},
    {"served_eval": False, "served_prompts": 2, "served_steps": 2, "ngram_baseline": False},
    {"arms": ["a", "b"]},
    {"l2sp": 0.5},  # arm d added
    {"probe_pilot_steps": 0},  # the pilot dropped
    {"device": "auto"},  # resolves to the CPU it ran on (no GPU in the tests)
])
def test_changes_a_resume_takes_still_resume(tmp_path, levels, change):
    cfg = dataclasses.replace(get_config("smoke"), device="cpu")
    run_dir = tmp_path / "d"
    _recorded(run_dir, cfg)
    with pytest.raises(levels.Reached):
        study.run_study(dataclasses.replace(cfg, **change), tmp_path / "runs", tmp_path / "c", run_dir=run_dir)
    assert levels == [run_dir]


def test_a_sweep_resumes_with_levels_added(tmp_path, levels):
    cfg = dataclasses.replace(get_config("drift-sweep"), device="cpu")
    _recorded(tmp_path / "d", cfg)
    with pytest.raises(levels.Reached):
        study.run_study(dataclasses.replace(cfg, drift_levels=[0.0, 0.5, 1.0, 4.0]), tmp_path / "runs",
                        tmp_path / "c", run_dir=tmp_path / "d")
    assert levels == [tmp_path / "d" / "drift-0"]


@pytest.mark.parametrize("change, field", [
    ({"arm_steps": 30}, "arm_steps"),
    ({"seed": 1}, "seed"),
    ({"l2sp": 0.5}, "l2sp"),  # arm d trained with another strength
    ({"probe_pilot_steps": 4}, "probe_pilot_steps"),
    ({"drift_levels": [0.5]}, "drift_levels"),
    ({"device": "cuda"}, "device"),  # features captured on another device type
])
def test_changes_an_arm_would_refuse_are_refused_first(tmp_path, levels, monkeypatch, change, field):
    import torch

    from drafter_lab.targets import hf

    real = hf.resolve_device  # a GPU named on a machine without one
    monkeypatch.setattr(study, "resolve_device", lambda d: torch.device("cuda") if d == "cuda" else real(d))
    monkeypatch.setattr(study, "check_study", lambda cfg: None)
    cfg = dataclasses.replace(get_config("smoke"), device="cpu", l2sp=0.1)
    _recorded(tmp_path / "d", cfg)
    with pytest.raises(LabError, match=rf"another config \({field} differ\)"):
        study.run_study(dataclasses.replace(cfg, **change), tmp_path / "runs", tmp_path / "c", run_dir=tmp_path / "d")
    assert levels == []


def test_a_killed_study_is_checked_against_the_config_it_began_with(tmp_path, levels):
    cfg = get_config("smoke")
    with pytest.raises(levels.Reached):  # killed in its first stage
        study.run_study(cfg, tmp_path / "runs", tmp_path / "c", run_dir=tmp_path / "d")
    with pytest.raises(LabError, match=r"another config \(arm_steps differ\)"):
        study.run_study(dataclasses.replace(cfg, arm_steps=30), tmp_path / "runs", tmp_path / "c",
                        run_dir=tmp_path / "d")
    with pytest.raises(levels.Reached):
        study.run_study(cfg, tmp_path / "runs", tmp_path / "c", run_dir=tmp_path / "d")
    assert len(levels) == 2


def test_a_field_older_runs_lack_is_not_judged(tmp_path, levels):
    cfg = get_config("smoke")
    old = {k: v for k, v in to_dict(cfg).items() if k not in ("transfer_lr_scale", "ngram_baseline")}
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"config": old}))
    with pytest.raises(levels.Reached):
        study.run_study(dataclasses.replace(cfg, transfer_lr_scale=0.5), tmp_path / "runs", tmp_path / "c",
                        run_dir=tmp_path / "d")


@pytest.mark.parametrize("over, message", [
    ({"pilot_min_gain": 5}, r"pilot_min_gain is a fraction \(0.01 = 1 point of cond_acc_0\), and a lead is at most 1: "
                            r"5 is never met"),
    ({"transfer_min_cka": 80}, r"transfer_min_cka is a linear CKA, at most 1 \(0.8 = 80%\): 80 is never met"),
])
def test_a_threshold_no_measure_reaches_is_refused(over, message):
    """`pilot_min_gain = 5` meaning five points never let the pilot say transfer, silently."""
    from drafter_lab.experiments.config import ProbeThresholds

    with pytest.raises(LabError, match=f"^{message}$"):
        ProbeThresholds(**over)


def test_thresholds_at_the_ends_of_their_range_stay():
    from drafter_lab.experiments.config import ProbeThresholds

    # 1: the pilot says scratch unless transfer is perfect and scratch nil (tests/experiments/test_probe.py);
    # a reuse fraction above 1 asks zero-shot to beat home
    th = ProbeThresholds(pilot_min_gain=1.0, transfer_min_cka=1.0, reuse_fraction=2.0)
    assert (th.pilot_min_gain, th.transfer_min_cka, th.reuse_fraction) == (1.0, 1.0, 2.0)


def test_cli_probe_refuses_a_gain_in_points_before_loading_anything(tmp_path, capsys):
    argv = ["probe", "--drafter", str(tmp_path / "d"), "--target", str(tmp_path / "t"), "--data", str(tmp_path / "f"),
            "--pilot-min-gain", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --pilot-min-gain is a fraction") and err.count("\n") == 1
