"""The study's pieces the mutation audit of study.py (helper h5) found unpinned: each stage's time and
the invocation's wall time (on a clock stood in), an arm that left no metrics, what this machine or the
preset cannot run refused before a run directory, a resume on another device type, a --run-dir whose
manifest.json is no JSON object, the command the manifest records, a single level's histories in the
run directory itself, and two levels plotted as a sweep."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from drafter_lab.config import to_dict
from drafter_lab.errors import LabError
from drafter_lab.experiments import plots, report, study
from drafter_lab.experiments.config import get_config


class Clock:
    """A clock one second later at each reading: a stage's time is the readings it spans."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def stood_in(monkeypatch):
    """run_level's heavy pieces stood in: no target, data, training, probe or plot."""

    def features(target_dir, prompts, cache, cfg):
        out = cache / "features" / Path(target_dir).name
        out.mkdir(parents=True, exist_ok=True)
        return out

    def train(tcfg, target, feats, out, **kw):
        Path(out).mkdir(parents=True, exist_ok=True)
        return {}

    monkeypatch.setattr(study, "_served", lambda *a: None)
    monkeypatch.setattr(study, "_check_served", lambda *a: None)
    monkeypatch.setattr(study, "build_pair", lambda preset, out, **kw: {})
    monkeypatch.setattr(study, "_features", features)
    monkeypatch.setattr(study, "train", train)
    monkeypatch.setattr(study, "probe", lambda *a, **kw: {})
    monkeypatch.setattr(study.Manifest, "load", lambda d: type("M", (), {"to_json": lambda self: {"counts": {}}})())
    monkeypatch.setattr(plots, "learning_curves", lambda *a: None)
    monkeypatch.setattr(plots, "cond_acc_bars", lambda *a: None)
    monkeypatch.setattr(report, "watch_stop", lambda a, b: (None, 0, ""))
    monkeypatch.setattr(report, "speed_tables", lambda level: [])


def test_each_stage_times_only_itself(tmp_path, monkeypatch, stood_in):
    """Each stage's clock starts when it does: a stage timed from an earlier start, or a sum taken for
    a difference, would report the stages before it as its own."""
    monkeypatch.setattr(study, "time", Clock())
    cfg = dataclasses.replace(get_config("smoke"), device="cpu", l2sp=0.5)
    level = study.run_level(cfg, 1.0, tmp_path / "level", tmp_path / "cache")
    stages = ["pair_s", "features_s", "source_s", "probe_s", *(f"arm_{k}_s" for k in ("a", "b", "c", "d"))]
    assert level["timings"] == dict.fromkeys(stages, 1.0)
    # train stood in wrote no metrics.jsonl nor transfer.json: an arm without them has no history to plot
    assert [(a.history, a.transfer) for a in level["arms"]] == [([], None)] * 4


def test_results_record_the_invocations_wall_time(tmp_path, monkeypatch):
    """elapsed_s spans the levels: from the study's start to its last level's end."""
    clock = Clock()

    def level(cfg, drift, level_dir, cache):
        clock.now += 100.0  # the level's stages
        return {"drift_knob": drift, "arms": []}

    monkeypatch.setattr(study, "time", clock)
    monkeypatch.setattr(study, "run_level", level)
    monkeypatch.setattr(study, "data_record", lambda level: {})
    monkeypatch.setattr(report, "render", lambda cfg, levels, sweep, elapsed: f"{elapsed}\n")
    monkeypatch.setattr(report, "results_json", lambda levels, sweep, elapsed: {"elapsed_s": elapsed})
    run = study.run_study(dataclasses.replace(get_config("smoke"), device="cpu"), tmp_path / "runs",
                          tmp_path / "cache", run_dir=tmp_path / "d")
    assert json.loads((run / "results.json").read_text()) == {"elapsed_s": 101.0}
    assert (run / "report.md").read_text() == "101.0\n"


@pytest.mark.parametrize("change, message", [
    ({"threads": 4 * (os.cpu_count() or 1) + 1}, r"^threads must be at most \d+ \(4 per CPU\)"),
    ({"device": "cuda:99"}, r"^device 'cuda:99': "),  # no CUDA device here, or fewer than 100
    ({"draft_vocab_size": 10**9}, r"^draft_vocab_size must be at most \d+ \(target preset "),
])
def test_what_this_machine_or_preset_cannot_run_is_refused_before_a_run_directory(tmp_path, levels, change, message):
    cfg = dataclasses.replace(get_config("smoke"), **{"device": "cpu", **change})
    with pytest.raises(LabError, match=message):
        study.run_study(cfg, tmp_path / "runs", tmp_path / "cache")
    assert levels == [] and not (tmp_path / "runs").exists()


def test_a_run_dir_of_another_device_type_is_refused(tmp_path, levels):
    """Features differ by the device type they were captured on (study._features): a run made on a
    GPU resumed on the CPU would capture and train its arms again."""
    cfg = dataclasses.replace(get_config("smoke"), device="cpu")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text(
        json.dumps({"config": {**to_dict(cfg), "device": "cuda"}, "device": {"type": "cuda"}}))
    with pytest.raises(LabError, match=r"another config \(device differ\)"):
        study.run_study(cfg, tmp_path / "runs", tmp_path / "c", run_dir=tmp_path / "d")
    assert levels == []


@pytest.mark.parametrize("manifest", ["[1, 2]", '"config"', "null"])
def test_a_manifest_that_is_no_object_is_refused_in_one_line(tmp_path, levels, manifest):
    """A hand-edited or foreign manifest.json holding a list or a string: its .get() was an AttributeError."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text(manifest)
    with pytest.raises(LabError, match=r"manifest.json records no study config: not a study's run directory"):
        study.run_study(dataclasses.replace(get_config("smoke"), device="cpu"), tmp_path / "runs", tmp_path / "c",
                        run_dir=tmp_path / "d")
    assert levels == []


@pytest.mark.parametrize("command, recorded", [(None, []), (["experiment", "--config", "smoke"],
                                                             ["experiment", "--config", "smoke"])])
def test_the_manifest_records_the_command_a_list_even_without_one(tmp_path, levels, command, recorded):
    """A study run from Python (no command line) records an empty command, not null: one list type to read."""
    with pytest.raises(levels.Reached):
        study.run_study(dataclasses.replace(get_config("smoke"), device="cpu"), tmp_path / "runs", tmp_path / "c",
                        run_dir=tmp_path / "d", command=command)
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["command"] == recorded


def test_a_single_level_keeps_its_arms_histories_in_the_run_directory(tmp_path, monkeypatch, stood_in):
    """One level trains in the run directory itself (a sweep's levels in drift-* below it): its histories too."""
    monkeypatch.setattr(study, "data_record", lambda level: {})
    monkeypatch.setattr(report, "render", lambda *a: "report\n")
    monkeypatch.setattr(report, "results_json", lambda *a: {})
    run = study.run_study(dataclasses.replace(get_config("smoke"), device="cpu"), tmp_path / "runs",
                          tmp_path / "cache", run_dir=tmp_path / "d")
    assert sorted(p.name for p in run.glob("metrics-*.jsonl")) == ["metrics-a.jsonl", "metrics-b.jsonl",
                                                                   "metrics-c.jsonl"]
    assert not list(run.glob("drift-*"))


def test_two_levels_make_a_sweep(tmp_path, monkeypatch):
    """Two levels already train in drift-* directories (and resume as a sweep): they are plotted as one too."""
    drawn = []
    monkeypatch.setattr(study, "run_level", lambda cfg, drift, level_dir, cache: {"drift_knob": drift, "arms": []})
    monkeypatch.setattr(study, "data_record", lambda level: {})
    monkeypatch.setattr(report, "sweep_points", lambda levels: [{"drift_knob": lv["drift_knob"]} for lv in levels])
    monkeypatch.setattr(report, "render", lambda *a: "report\n")
    monkeypatch.setattr(report, "results_json", lambda levels, sweep, elapsed: {"sweep": sweep})
    monkeypatch.setattr(plots, "drift_sweep", lambda points, path: drawn.append((points, path.name)))
    cfg = dataclasses.replace(get_config("drift-sweep"), device="cpu", drift_levels=[0.0, 1.0])
    run = study.run_study(cfg, tmp_path / "runs", tmp_path / "cache", run_dir=tmp_path / "d")
    sweep = [{"drift_knob": 0.0}, {"drift_knob": 1.0}]
    assert drawn == [(sweep, "drift_sweep.png")]
    assert json.loads((run / "results.json").read_text()) == {"sweep": sweep}
