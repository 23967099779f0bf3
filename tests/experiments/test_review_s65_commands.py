"""Review of the `probe`, `experiment` and `reproduce` command lines: which cache root wins, the probe's
settings refused (or taken) before its signals and what reaches the probe, what `reproduce` says and
exits with when metrics differ, and study settings refused at the ends of their ranges."""

from __future__ import annotations

import argparse

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.experiments import commands
from drafter_lab.experiments.config import get_config

PROBE = ["probe", "--drafter", "d", "--target", "t", "--data", "f"]


def test_the_cache_flag_wins_over_the_environment_which_wins_over_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTER_LAB_CACHE", str(tmp_path / "env"))
    assert commands._cache_root(argparse.Namespace(cache=str(tmp_path / "flag"))) == tmp_path / "flag"
    assert commands._cache_root(argparse.Namespace(cache=None)) == tmp_path / "env"
    monkeypatch.delenv("DRAFTER_LAB_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert commands._cache_root(argparse.Namespace(cache=None)) == tmp_path / "home" / ".cache" / "drafter_lab"


@pytest.fixture
def probed(monkeypatch):
    """The probe's arguments, the probe itself refused (so the command stops there, in one line)."""
    import torch

    from drafter_lab.experiments import probe as probe_mod

    seen = {}

    def probe(*args, **kwargs):
        seen.update(kwargs)
        raise LabError("probed")

    monkeypatch.setattr(probe_mod, "probe", probe)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.setdefault("torch_threads", n))
    return seen


def test_negative_threads_are_refused_before_the_probe(probed, capsys):
    """-1 was taken as 0, torch's default."""
    assert main([*PROBE, "--threads", "-1"]) == 2
    assert capsys.readouterr().err == "error: --threads must be >= 0 (0: torch's default), got -1\n"
    assert probed == {}


def test_a_zero_transfer_rate_freezes_the_transferred_weights_and_is_taken(probed, capsys):
    assert main([*PROBE, "--transfer-lr-scale", "0"]) == 2
    assert capsys.readouterr().err == "error: probed\n"
    assert probed["transfer_lr_scale"] == 0.0


def test_threads_reach_torch_and_the_pilots_recipe(probed, capsys):
    assert main([*PROBE, "--threads", "1"]) == 2
    assert capsys.readouterr().err == "error: probed\n"
    assert (probed["torch_threads"], probed["pilot_recipe"].threads) == (1, 1)


def test_a_pilot_dir_that_is_a_file_is_refused_before_the_signals(probed, tmp_path, capsys):
    (tmp_path / "pilot").write_text("mine")
    assert main([*PROBE, "--pilot-dir", str(tmp_path / "pilot")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'pilot'}: not a directory\n"
    assert probed == {}


def test_reproduce_lists_the_metrics_that_differ_and_exits_1(tmp_path, monkeypatch, capsys):
    from drafter_lab.experiments import reproduce as reproduce_mod

    orig, new, cache = tmp_path / "orig", tmp_path / "orig-repro", tmp_path / "cache"
    for d in (orig, new):
        d.mkdir()
        (d / "manifest.json").write_text("{}")
    diffs = [("level 1/arm a/cond_acc_0", 0.5, 0.25), ("level 1/ngram", reproduce_mod.ABSENT, 1.5),
             ("level 1/probe", None, reproduce_mod.ABSENT)]
    monkeypatch.setattr(reproduce_mod, "reproduce", lambda *a, **k: (new, diffs))
    assert main(["reproduce", str(orig), "--runs", str(tmp_path), "--cache", str(cache)]) == 1
    out = capsys.readouterr().out
    assert "metrics that differ (3)" in out and "identical" not in out
    rows = [line.replace("│", " ").split() for line in out.splitlines() if "level 1/" in line]
    assert rows == [["level", "1/arm", "a/cond_acc_0", "0.5", "0.25"], ["level", "1/ngram", "absent", "1.5"],
                    ["level", "1/probe", "null", "absent"]]  # a metric recorded as null is not one never written


@pytest.mark.parametrize("over, message", [
    ({"seed": 2**32}, r"seed must be in \[0, 2\*\*32\), got 4294967296"),  # TrainConfig's range, refused by every arm
    ({"arms": ["a", "b", "d"]}, "arms must include a and b and be among a, b, c"),  # d follows l2sp
    ({"arms": ["a", "b", "x"]}, "arms must include a and b and be among a, b, c"),
    ({"eval_every": -1}, "eval_every must be >= 0 and finite, got -1"),
])
def test_study_settings_past_the_ends_of_their_ranges_are_refused(over, message):
    import dataclasses

    with pytest.raises(LabError, match=f"^{message}"):
        dataclasses.replace(get_config("smoke"), **over)


def test_the_presets_are_the_studies_the_readme_reports():
    """README: drift-sweep is knobs 0 / 0.5 / 1 with arms (a) and (b) only, 200 steps per arm; seeds-finetune
    trains arm (b)'s transferred weights at a tenth of the rate, 2000 steps per arm, at knob 4."""
    sweep, seeds = get_config("drift-sweep"), get_config("seeds-finetune")
    assert (sweep.drift_levels, sweep.arms, sweep.arm_steps) == ([0.0, 0.5, 1.0], ["a", "b"], 200)
    assert (seeds.drift_levels, seeds.transfer_lr_scale, seeds.arm_steps) == ([4.0], 0.1, 2000)


def test_an_unknown_study_config_is_one_line_naming_the_known_ones(tmp_path, capsys):
    assert main(["experiment", "--config", "tiny", "--runs", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == ("error: unknown experiment config 'tiny'; known: tiny-cpu, drift-sweep, "
                                       "seeds-finetune, gpu-small, smoke\n")
    assert not (tmp_path / "runs").exists()


def test_experiment_prints_its_run_dir_and_report_as_one_json_line(tmp_path, monkeypatch, capsys):
    """The line a script reads to find the study it started."""
    import json

    from drafter_lab.experiments import study

    monkeypatch.setattr(study, "run_study", lambda *a, **kw: tmp_path / "runs" / "smoke-1")
    assert main(["experiment", "--config", "smoke", "--runs", str(tmp_path / "runs")]) == 0
    assert json.loads(capsys.readouterr().out) == {"run_dir": str(tmp_path / "runs" / "smoke-1"),
                                                   "report": str(tmp_path / "runs" / "smoke-1" / "report.md")}


@pytest.mark.parametrize("by, said", [("token", "token string"), ("id", "token id")])
def test_the_probe_table_shows_every_draft_steps_accuracy_and_how_the_vocabs_were_compared(monkeypatch, capsys,
                                                                                         by, said):
    from drafter_lab.experiments import probe as probe_mod

    result = {"zero_shot": {"simulated_accept_len": 1.5, "cond_acc_0": 0.5, "cond_acc_1": 0.25, "cond_acc_2": 0.125},
              "home": None, "aux_cka": None, "pilot": None, "target": {"vocab_size": 512},
              "vocab": {"same_positions": 40, "size_a": 64, "shared_tokens": 60, "by": by,
                        "drafter_target_vocab_size": 512},
              "verdict": "train from scratch", "reason": "because"}
    monkeypatch.setattr(probe_mod, "probe", lambda *a, **kw: result)
    assert main(PROBE) == 0
    out = capsys.readouterr().out
    rows = {" ".join(cells[:-1]): cells[-1] for line in out.splitlines()
            if len(cells := line.replace("│", " ").split()) > 1}
    assert [rows.get(f"zero-shot cond_acc_{k}") for k in range(4)] == ["0.500", "0.250", "0.125", None]
    assert rows["vocabularies compared by token"] == said.split()[1]
    assert rows["draft positions that agree 40 /"] == "64"


@pytest.mark.parametrize("command", [["experiment", "--config", "smoke"], ["reproduce", "orig"]])
def test_a_cache_below_a_file_names_the_variable_that_set_it_not_a_flag_never_given(tmp_path, monkeypatch, capsys,
                                                                                    command):
    """It said "--cache lies below a file" to a user who had typed no --cache."""
    (tmp_path / "afile").write_text("mine")
    monkeypatch.setenv("DRAFTER_LAB_CACHE", str(tmp_path / "afile" / "cache"))
    assert main([*command, "--runs", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'afile' / 'cache'}: $DRAFTER_LAB_CACHE lies below a file, "
                                       "not a directory\n")
    assert main([*command, "--runs", str(tmp_path / "runs"), "--cache", str(tmp_path / "afile" / "c")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'afile' / 'c'}: --cache lies below a file, not a directory\n"
