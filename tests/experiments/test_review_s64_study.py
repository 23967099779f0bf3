"""The study's pieces no other test pins: arm d's recipe, a keyed field off its default, the served
prompts cut, a --run-dir whose manifest lacks a device record or holds no config object, the manifest
a resume leaves as it began, the sweep only for several levels, and the data record's hashes."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from drafter_lab.config import to_dict
from drafter_lab.errors import LabError
from drafter_lab.experiments import plots, study
from drafter_lab.experiments.config import get_config
from drafter_lab.experiments.probe import ProbeThresholds


def test_arm_d_is_the_remapped_transfer_regularised():
    cfg = dataclasses.replace(get_config("tiny-cpu"), l2sp=0.25)
    got = {a.key: (a.init_from, a.remap, a.l2sp) for a in study.arms_for(cfg)}
    assert got == {"a": (False, True, 0.0), "b": (True, True, 0.0), "c": (True, False, 0.0), "d": (True, True, 0.25)}


def test_an_unkeyed_field_off_its_default_is_keyed(tmp_path, monkeypatch):
    """UNKEYED_DEFAULTS leave a field out of the source drafter's key only at the value older drafters
    were trained with: another value trains another drafter."""
    cfg = get_config("tiny-cpu")
    key = study._source_key(tmp_path / "abc", cfg)
    real = study._train_config
    monkeypatch.setattr(study, "_train_config", lambda c, s: dataclasses.replace(real(c, s), accumulation_steps=2))
    assert study._source_key(tmp_path / "abc", cfg) != key


def test_the_served_evaluation_decodes_the_first_served_prompts(tmp_path, monkeypatch):
    import torch

    from drafter_lab.spec import eval as spec_eval

    target = type("T", (), {"device": torch.device("meta")})()
    monkeypatch.setattr("drafter_lab.targets.hf.load_target", lambda path, device="cpu": target)
    monkeypatch.setattr("drafter_lab.drafter.checkpoint.load_drafter", lambda path, target=None, device="cpu": "d")
    monkeypatch.setattr("drafter_lab.data.conversations.read_conversations", lambda path, **kw: (list("abcde"), {}))
    monkeypatch.setattr(spec_eval, "evaluate", lambda target, drafter, convs, **kw: {"convs": convs, **kw})
    cfg = dataclasses.replace(get_config("smoke"), served_eval=True, served_prompts=2, served_steps=3)
    got = study._served(cfg, tmp_path / "drafter", tmp_path / "target", tmp_path / "prompts.jsonl")
    assert got["convs"] == ["a", "b"] and got["steps"] == got["draft_tokens"] == 3
    assert study._served(dataclasses.replace(cfg, served_eval=False), tmp_path, tmp_path, tmp_path) is None


def test_a_manifest_without_a_device_record_is_not_judged_on_its_device(tmp_path, levels):
    """A run older than the manifest's device record: its features' device type is unknown, so the
    device field is not judged (as a field an older run lacks)."""
    cfg = dataclasses.replace(get_config("smoke"), device="cpu")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"config": {**to_dict(cfg), "device": "cuda"}}))
    with pytest.raises(levels.Reached):
        study.run_study(cfg, tmp_path / "runs", tmp_path / "c", run_dir=tmp_path / "d")
    assert levels == [tmp_path / "d"]


@pytest.mark.parametrize("config", [["arm_steps", "seed"], "smoke", 3])
def test_a_manifest_whose_config_is_no_object_is_refused_in_one_line(tmp_path, levels, config):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"config": config}))
    with pytest.raises(LabError, match="records no study config: not a study's run directory"):
        study.run_study(get_config("smoke"), tmp_path / "runs", tmp_path / "c", run_dir=tmp_path / "d")
    assert levels == []


def test_a_resume_leaves_the_manifest_it_began_with(tmp_path, levels):
    """The manifest written as a study begins records the command and code it began with: a resume
    (here with other threads) does not overwrite them before it finishes."""
    cfg = dataclasses.replace(get_config("smoke"), device="cpu")
    (tmp_path / "d").mkdir()
    began = json.dumps({"config": to_dict(cfg), "device": {"type": "cpu"}, "command": ["first"],
                        "git": {"sha": "abc", "dirty": False}})
    (tmp_path / "d" / "manifest.json").write_text(began)
    with pytest.raises(levels.Reached):
        study.run_study(dataclasses.replace(cfg, threads=2), tmp_path / "runs", tmp_path / "c",
                        run_dir=tmp_path / "d", command=["second"])
    assert (tmp_path / "d" / "manifest.json").read_text() == began


def _level(drift):
    arm = [study.Arm(k, f"({k})", history=[{"split": "val", "step": 0, "cond_acc_0": 0.5, "loss_0": 1.0}],
                     final={"cond_acc_0": 0.5, "loss_0": 1.0, "simulated_accept_len": 1.0}) for k in "ab"]
    probe = {"zero_shot": {"simulated_accept_len": 0.5}, "aux_cka": [0.9], "verdict": "train from scratch",
             "reason": "x", "vocab": {"same_positions": 1, "size_a": 2, "shared_tokens": 2, "by": "id"},
             "thresholds": dataclasses.asdict(ProbeThresholds())}
    return {"drift_knob": drift, "pair": {}, "timings": {}, "arms": arm, "probe": probe}


@pytest.mark.parametrize("name, sweep", [("smoke", False), ("drift-sweep", True)])
def test_only_several_levels_make_a_sweep(tmp_path, monkeypatch, name, sweep):
    drawn = []
    monkeypatch.setattr(study, "run_level", lambda cfg, drift, level_dir, cache: _level(drift))
    monkeypatch.setattr(study, "data_record", lambda level: {})
    monkeypatch.setattr(plots, "drift_sweep", lambda points, path: drawn.append(path))
    cfg = dataclasses.replace(get_config(name), device="cpu")
    run = study.run_study(cfg, tmp_path / "runs", tmp_path / "c", run_dir=tmp_path / "d")
    results = json.loads((run / "results.json").read_text())
    assert (results["sweep"] is not None) == sweep == bool(drawn)
    assert ("## Drift sweep" in (run / "report.md").read_text()) == sweep
    if sweep:
        assert [p["drift_knob"] for p in results["sweep"]] == cfg.drift_levels


def test_the_data_record_hashes_the_shards_and_both_prompt_files(tmp_path):
    pair_dir = tmp_path / "pair"
    pair_dir.mkdir()
    for name in ("prompts-train.jsonl", "prompts-eval.jsonl"):
        (pair_dir / name).write_text("{}\n")
    feats = tmp_path / "one" / "feats"
    feats.mkdir(parents=True)
    shards = {"train": [{"file": "train-0.pt", "sequences": 4, "sha256": "aa"}], "val": []}
    (feats / "manifest.json").write_text(json.dumps({"shards": shards, "source": {"dir": str(feats)}}))
    moved = tmp_path / "two" / "feats"
    shutil.copytree(feats, moved)
    manifest = json.loads((moved / "manifest.json").read_text())
    (moved / "manifest.json").write_text(json.dumps({**manifest, "source": {"dir": str(moved)}}))

    def record(base, tuned):
        return study.data_record({"pair": {}, "pair_dir": str(pair_dir), "feature_manifests": {},
                                  "features": {"base": str(base), "tuned": str(tuned)}})

    first = record(feats, moved)
    assert first["features"]["base"]["shards_sha256"] == first["features"]["tuned"]["shards_sha256"]  # same shards
    (moved / "manifest.json").write_text(json.dumps({"shards": {**shards, "val": [{"file": "v", "sha256": "bb"}]}}))
    assert record(feats, moved)["features"]["tuned"]["shards_sha256"] != first["features"]["base"]["shards_sha256"]
    (pair_dir / "prompts-eval.jsonl").write_text("{}\n{}\n")
    assert record(feats, feats)["pair"]["prompts_sha256"]["prompts-eval.jsonl"] != \
        first["pair"]["prompts_sha256"]["prompts-eval.jsonl"]
