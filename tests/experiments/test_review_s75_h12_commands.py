"""Review s75 (h12) of the `probe` and `experiment` command lines, the probe and the study stubbed: what
--json writes, the probe table's optional rows, the --pilot-config recipe and thread counts that reach
the probe, and what reaches the study (--run-dir, the command line recorded)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from drafter_lab.cli import main

PROBE = ["probe", "--drafter", "d", "--target", "t", "--data", "f"]


def _result(**over):
    result = {"zero_shot": {"simulated_accept_len": 1.5, "cond_acc_0": 0.5}, "home": None, "aux_cka": None,
              "pilot": None, "target": {"vocab_size": 512},
              "vocab": {"same_positions": 40, "size_a": 64, "shared_tokens": 60, "by": "id",
                        "drafter_target_vocab_size": 512},
              "verdict": "train from scratch", "reason": "because"}
    return {**result, **over}


@pytest.fixture
def probe_gives(monkeypatch):
    """Stub the probe to return `result`; the keyword arguments it was called with land in `seen`."""
    from drafter_lab.experiments import probe as probe_mod

    seen = {}

    def give(result):
        monkeypatch.setattr(probe_mod, "probe", lambda *a, **kw: seen.update(kw) or result)
        return seen

    return give


def _rows(out: str) -> dict[str, str]:
    return {" ".join(cells[:-1]): cells[-1] for line in out.splitlines()
            if len(cells := line.replace("│", " ").split()) > 1}


def test_json_writes_the_probes_result(tmp_path, probe_gives, capsys):
    probe_gives(_result())
    assert main([*PROBE, "--json", str(tmp_path / "probe.json")]) == 0
    assert json.loads((tmp_path / "probe.json").read_text()) == _result()
    assert "verdict: train from scratch" in capsys.readouterr().out


def test_without_json_nothing_is_written(tmp_path, probe_gives, monkeypatch, capsys):
    probe_gives(_result())
    monkeypatch.chdir(tmp_path)
    assert main(PROBE) == 0
    assert list(tmp_path.iterdir()) == []


def test_the_probe_table_shows_home_cka_pilot_and_the_two_vocab_sizes(probe_gives, capsys):
    pilot = {"curve": [{"step": 0, "transfer_cond_acc_0": 0.25, "scratch_cond_acc_0": 0.125},
                       {"step": 8, "transfer_cond_acc_0": 0.5, "scratch_cond_acc_0": 0.375}]}
    vocab = {**_result()["vocab"], "drafter_target_vocab_size": 500}
    probe_gives(_result(home={"simulated_accept_len": 2.25}, aux_cka=[0.91234, 0.8], pilot=pilot, vocab=vocab))
    assert main(PROBE) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert any(line.replace("┃", " ").split() == ["signal", "value"] for line in out.splitlines())  # the header
    assert rows["zero-shot simulated accept length"] == "1.50"
    assert rows["tokens shared"] == "60"
    assert rows["home simulated accept length (source target)"] == "2.25"
    assert (rows["aux layer 0 CKA (source vs new)"], rows["aux layer 1 CKA (source vs new)"]) == ("0.9123", "0.8000")
    assert rows["pilot step 0: val cond_acc_0 transfer / scratch 0.250 /"] == "0.125"
    assert rows["pilot step 8: val cond_acc_0 transfer / scratch 0.500 /"] == "0.375"
    assert rows["target vocab size (the drafter's / this one) 500 /"] == "512"


def test_the_optional_rows_are_left_out_where_the_probe_measured_nothing(probe_gives, capsys):
    probe_gives(_result())
    assert main(PROBE) == 0
    out = capsys.readouterr().out
    assert not any(word in out for word in ("home simulated", "aux layer", "pilot step", "target vocab size"))


def test_the_pilot_config_is_the_recipe_the_probe_gets(tmp_path, probe_gives, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[train]\nbatch_size = 3\nlr = 0.002\n")
    seen = probe_gives(_result())
    assert main([*PROBE, "--pilot-config", str(recipe)]) == 0
    assert (seen["pilot_recipe"].batch_size, seen["pilot_recipe"].lr) == (3, 0.002)
    assert main(PROBE) == 0
    assert seen["pilot_recipe"].batch_size != 3  # no file: TrainConfig's defaults


def test_by_default_torch_the_recipe_and_the_transfer_rate_are_left_alone(probe_gives, monkeypatch, capsys):
    import torch

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    seen = probe_gives(_result())
    for argv in (PROBE, [*PROBE, "--threads", "0"]):
        assert main(argv) == 0
        assert calls == [] and seen["pilot_recipe"].threads == 0 and seen["transfer_lr_scale"] == 1.0


def test_threads_past_4_per_cpu_are_refused_before_the_probe(probe_gives, capsys):
    seen = probe_gives(_result())
    most = 4 * (os.cpu_count() or 1)
    assert main([*PROBE, "--threads", str(most + 1)]) == 2
    assert capsys.readouterr().err == f"error: --threads must be at most {most} (4 per CPU), got {most + 1}\n"
    assert seen == {}


def test_the_probes_settings_and_thresholds_reach_it(probe_gives, capsys):
    seen = probe_gives(_result())
    assert main([*PROBE, "--pilot-steps", "6", "--pilot-min-gain", "0.05", "--reuse-fraction", "0.8"]) == 0
    assert seen["cfg"].pilot_steps == 6
    assert (seen["thresholds"].pilot_min_gain, seen["thresholds"].reuse_fraction) == (0.05, 0.8)


@pytest.fixture
def study_gets(monkeypatch, tmp_path):
    """Stub the study: the arguments it was called with land in the returned dict."""
    from drafter_lab.experiments import study

    seen = {}

    def run_study(cfg, runs, cache, run_dir, command):
        seen.update(cfg=cfg, runs=runs, cache=cache, run_dir=run_dir, command=command)
        return tmp_path / "runs" / "smoke-1"

    monkeypatch.setattr(study, "run_study", run_study)
    return seen


def test_experiment_hands_the_study_its_run_dir_and_the_command_line(tmp_path, study_gets, monkeypatch, capsys):
    argv = ["experiment", "--config", "smoke", "--runs", str(tmp_path / "runs"), "--cache", str(tmp_path / "c"),
            "--run-dir", str(tmp_path / "runs" / "old")]
    monkeypatch.setattr(sys, "argv", ["/usr/bin/drafter-lab", *argv])
    assert main(argv) == 0
    assert study_gets["run_dir"] == tmp_path / "runs" / "old" and study_gets["cache"] == tmp_path / "c"
    assert study_gets["command"] == ["drafter-lab", *argv]  # the manifest's command, as typed
    assert main(argv[:-2]) == 0
    assert study_gets["run_dir"] is None  # a new run directory under --runs


def test_reproduce_compares_exactly_by_default_and_heads_its_table(tmp_path, monkeypatch, capsys):
    from drafter_lab.experiments import reproduce as reproduce_mod

    orig, new = tmp_path / "orig", tmp_path / "orig-repro"
    for d in (orig, new):
        d.mkdir()
        (d / "manifest.json").write_text("{}")
    seen = []
    monkeypatch.setattr(reproduce_mod, "reproduce",
                        lambda *a: seen.append(a) or (new, [("level 1/arm a/cond_acc_0", 0.5, 0.25)]))
    assert main(["reproduce", str(orig), "--runs", str(tmp_path), "--cache", str(tmp_path / "cache")]) == 1
    assert seen[0][3] == 0.0  # by default nothing is forgiven: "identical" means identical
    out = capsys.readouterr().out
    assert any(line.replace("┃", " ").split() == ["metric", "original", "reproduced"] for line in out.splitlines())
