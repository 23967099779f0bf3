"""`drafter-lab experiment` and `probe`: settings that would run nothing, fail late or mean nothing are
refused before anything runs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.experiments.config import (
    ExperimentConfig,
    ProbeConfig,
    ProbeThresholds,
    get_config,
    level_name,
)


def test_an_empty_drift_level_list_is_refused(tmp_path, capsys):
    argv = ["experiment", "--config", "smoke", "--drift-levels", "", "--runs", str(tmp_path / "runs"),
            "--cache", str(tmp_path / "cache")]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: --drift-levels is empty: give at least one drift level\n"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("over, message", [
    # 0 steps was TrainConfig's max_steps 0, "no limit": 10,000 epochs of training
    ({"source_steps": 0}, "source_steps must be >= 1, got 0"),
    ({"arm_steps": 0}, "arm_steps must be >= 1, got 0"),
    ({"served_prompts": -1}, "served_prompts must be >= 1, got -1"),  # convs[:-1]: one prompt dropped
    ({"served_steps": 0}, "served_steps must be >= 1, got 0"),
    ({"probe_pilot_steps": -3}, "probe_pilot_steps must be >= 0 and finite, got -3"),
    ({"drift_levels": [0.5, math.inf]}, "drift_levels must be >= 0 and finite, got inf"),
    ({"drift_levels": [math.nan]}, "drift_levels must be >= 0 and finite, got nan"),
    ({"drift_levels": [-1.0]}, "drift_levels must be >= 0 and finite, got -1.0"),
    ({"drift_levels": [1.0, 0.5, 1.0]}, "drift_levels repeat: 1, 0.5, 1"),  # one run directory, two studies
    ({"lr": math.nan}, "lr must be >= 0 and finite, got nan"),
    ({"transfer_lr_scale": math.inf}, "transfer_lr_scale must be >= 0 and finite, got inf"),
    ({"regen_temperature": -1.0}, "regen_temperature must be >= 0 and finite, got -1.0"),
    ({"ttt_steps": 0}, "ttt_steps must be >= 1, got 0"),
    ({"seed": -1}, r"seed must be in \[0, 2\*\*32\), got -1"),
    ({"arms": ["a"]}, "arms must include a and b"),
    ({"arms": ["a", "b", "b"]}, "arms must include a and b and be among a, b, c, each once"),  # recorded twice
])
def test_study_settings_that_would_fail_or_run_nothing_are_refused(over, message):
    with pytest.raises(LabError, match=f"^{message}"):
        dataclasses.replace(get_config("smoke"), **over)


def test_zero_where_it_means_something_is_accepted():
    cfg = ExperimentConfig(name="x", probe_pilot_steps=0, eval_every=0, drift_levels=[0.0], threads=0)
    assert (cfg.probe_pilot_steps, cfg.eval_every, cfg.threads) == (0, 0, 0)  # no pilot, no extra validation
    assert ProbeConfig(pilot_steps=0).pilot_steps == 0  # the verdict from aux CKA


def test_each_drift_level_has_its_own_name():
    """A level's run and cache directory, manifest key and report heading: with `:g`, levels 0.1234561
    and 0.1234564 resumed each other's arms."""
    assert [level_name(d) for d in (0.0, 0.5, 1.0, 4.0, 1e-7)] == ["0", "0.5", "1", "4", "1e-07"]  # cached names kept
    assert level_name(0.1234561) != level_name(0.1234564)
    assert float(level_name(0.1234561)) == 0.1234561
    assert level_name(-0.0) == "0"  # `--drift-levels -0` had a "-0" directory and cache apart from 0's


@pytest.fixture
def no_study(monkeypatch):
    """These tests expect a refusal before the study: one that starts fails at once instead of training
    (arm_steps 0 trained 10,000 epochs)."""
    from drafter_lab.experiments import study

    monkeypatch.setattr(study, "run_study", lambda *a, **k: pytest.fail("the study ran"))


def test_cli_zero_arm_steps_is_refused_before_anything_is_built(tmp_path, capsys, no_study):
    argv = ["experiment", "--config", "smoke", "--arm-steps", "0", "--runs", str(tmp_path / "runs"),
            "--cache", str(tmp_path / "cache")]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: --arm-steps must be >= 1, got 0\n"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("option", ["--runs", "--run-dir", "--cache"])
def test_cli_directory_options_naming_a_file_are_one_line(tmp_path, capsys, no_study, option):
    afile = tmp_path / "afile"
    afile.write_text("")
    dirs = {"--runs": tmp_path / "runs", "--cache": tmp_path / "cache"}
    argv = ["experiment", "--config", "smoke", *(x for k, v in {**dirs, option: afile}.items() for x in (k, str(v)))]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {afile}: not a directory\n"
    assert not any(d.exists() for d in dirs.values())


@pytest.mark.parametrize("command, option", [("experiment", "--runs"), ("experiment", "--run-dir"),
                                             ("experiment", "--cache"), ("reproduce", "--runs"),
                                             ("reproduce", "--cache")])
def test_cli_empty_directory_options_are_refused(tmp_path, capsys, no_study, monkeypatch, command, option):
    """An empty --run-dir started a new run instead of resuming, an empty --runs wrote into the current
    directory and an empty --cache fell back to the default cache."""
    monkeypatch.chdir(tmp_path)
    argv = [command, *(["--config", "smoke"] if command == "experiment" else [str(tmp_path / "old-run")]),
            "--runs", str(tmp_path / "runs"), "--cache", str(tmp_path / "cache"), option, ""]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert f"error: argument {option}: empty: name a file or directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("over, message", [
    ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ({"ttt_steps": 0}, "ttt_steps must be >= 1, got 0"),
    ({"max_sequences": 0}, "max_sequences must be >= 1, got 0"),
    ({"cka_tokens": 1}, "cka_tokens must be >= 2, got 1"),  # a nan CKA, and a verdict from it
    ({"pilot_steps": -3}, "pilot_steps must be >= 0 and finite, got -3"),  # was: no pilot, silently
])
def test_probe_settings_that_would_fail_or_mean_nothing_are_refused(over, message):
    with pytest.raises(LabError, match=f"^{message}$"):
        ProbeConfig(**over)


@pytest.mark.parametrize("field", ["reuse_fraction", "transfer_min_cka", "pilot_min_gain"])
def test_probe_thresholds_must_be_finite(field):
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(LabError, match=f"^{field} must be a finite number, got {value}$"):
            ProbeThresholds(**{field: value})
    assert getattr(ProbeThresholds(**{field: -1.0}), field) == -1.0  # any line: -1 makes the pilot always pass


def test_cli_probe_refuses_a_zero_count_before_loading_anything(tmp_path, capsys):
    argv = ["probe", "--drafter", str(tmp_path / "d"), "--target", str(tmp_path / "t"), "--data", str(tmp_path / "f"),
            "--ttt-steps", "0"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: --ttt-steps must be >= 1, got 0\n"


def test_the_help_names_every_study_config(capsys):
    from drafter_lab.experiments.config import PRESETS

    with pytest.raises(SystemExit):
        main(["experiment", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in PRESETS), text  # seeds-finetune was missing
