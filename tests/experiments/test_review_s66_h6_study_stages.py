"""The study's stages with every heavy piece stood in (helper h6's audit): each arm trains on the tuned
target to the same budget and seed, only the transfer arms start from the source drafter at the
transfer rate, the probe and the served evaluations get the arms' recipe and target, the source drafter
is trained once and then reused, each level's arm histories land in its own directory, the CPU's
feature key is pinned, and a --run-dir resume refuses a single-level study turned into a sweep (or
back), any recipe change, and a hand-edited manifest's drift levels that are no list."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.experiments import plots, report, study
from drafter_lab.experiments.config import get_config


@pytest.fixture
def stages(tmp_path, monkeypatch):
    """run_level's heavy pieces stood in: `calls` records each train() and the watch's arguments."""
    calls = {"train": [], "watch": [], "served": [], "probe": [], "plots": []}

    def features(target_dir, prompts, cache, cfg):
        out = cache / "features" / Path(target_dir).name
        out.mkdir(parents=True, exist_ok=True)
        return out

    def train(tcfg, target, feats, out, resume=False, init_from=None, remap=True, l2sp=0.0, transfer_lr_scale=1.0):
        calls["train"].append({"out": Path(out), "target": Path(target).name, "features": Path(feats).name,
                               "steps": tcfg.max_steps, "seed": tcfg.seed, "resume": resume, "init_from": init_from,
                               "remap": remap, "l2sp": l2sp, "transfer_lr_scale": transfer_lr_scale,
                               "threads": torch.get_num_threads()})
        Path(out).mkdir(parents=True, exist_ok=True)
        row = {"split": "val", "step": tcfg.max_steps, "cond_acc_0": 0.5}
        (Path(out) / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        if init_from is not None:
            (Path(out) / "transfer.json").write_text(json.dumps({"from": str(init_from)}))
        return {"cond_acc_0": 0.5}

    def watch_stop(a, b):
        calls["watch"].append((a.key, b.key))
        return 12, 0, ""

    def served(cfg, drafter, target_dir, prompts):
        calls["served"].append((drafter, Path(target_dir).name, Path(prompts).name))
        return {"drafter": drafter}

    def probe(source, target, feats, base, cfg, pilot_recipe, pilot_dir, transfer_lr_scale):
        calls["probe"].append({"source": source, "target": Path(target).name, "features": Path(feats).name,
                               "base": Path(base).name, "pilot_steps": cfg.pilot_steps, "ttt_steps": cfg.ttt_steps,
                               "recipe": pilot_recipe, "pilot_dir": pilot_dir, "transfer_lr_scale": transfer_lr_scale})
        return {"verdict": "x"}

    monkeypatch.setattr(study, "_served", served)
    monkeypatch.setattr(study, "_check_served", lambda *a: None)  # no pair is built
    monkeypatch.setattr(study, "build_pair", lambda preset, out, **kw: {})
    monkeypatch.setattr(study, "_features", features)
    monkeypatch.setattr(study, "train", train)
    monkeypatch.setattr(study, "probe", probe)
    monkeypatch.setattr(study.Manifest, "load", lambda d: type("M", (), {"to_json": lambda self: {"counts": {}}})())
    monkeypatch.setattr(plots, "learning_curves", lambda arms, path, random_loss, stop: calls["plots"].append(
        ("curves", path.name, random_loss, stop)))
    monkeypatch.setattr(plots, "cond_acc_bars", lambda arms, path, k: calls["plots"].append(("bars", path.name, k)))
    monkeypatch.setattr(plots, "speed_by_depth", lambda drafters, baselines, path: calls["plots"].append(
        ("speed", path.name, drafters)))
    monkeypatch.setattr(report, "watch_stop", watch_stop)
    monkeypatch.setattr(report, "speed_tables", lambda level: [])
    return calls


def test_every_arm_trains_the_same_budget_and_only_transfers_start_from_the_source(tmp_path, stages):
    cfg = dataclasses.replace(get_config("smoke"), device="cpu", seed=7, l2sp=0.5, transfer_lr_scale=0.1)
    level = study.run_level(cfg, 1.0, tmp_path / "level", tmp_path / "cache")
    source, *arms = stages["train"]
    assert source["out"].parent == tmp_path / "cache" / "source-drafters"
    assert (source["target"], source["steps"], source["init_from"]) == ("base", cfg.source_steps, None)
    got = {a["out"].name: (a["init_from"], a["remap"], a["l2sp"], a["transfer_lr_scale"]) for a in arms}
    # scratch has no transferred weight, so no transfer rate
    assert got == {"a": (None, True, 0.0, 1.0), "b": (source["out"], True, 0.0, 0.1),
                   "c": (source["out"], False, 0.0, 0.1), "d": (source["out"], True, 0.5, 0.1)}
    # equal budgets: one target, one feature set, one step count and seed; each resumes a killed study
    assert {(a["target"], a["features"], a["steps"], a["seed"], a["resume"]) for a in arms} == \
        {("tuned", "tuned", cfg.arm_steps, 7, True)}
    assert all(a["out"] == tmp_path / "level" / "arms" / a["out"].name for a in arms)
    assert [a.history for a in level["arms"]] == [[{"split": "val", "step": cfg.arm_steps, "cond_acc_0": 0.5}]] * 4
    assert stages["watch"] == [("a", "b")]  # (a) is the baseline the watch replays (b) against
    assert json.loads((tmp_path / "level" / "probe.json").read_text()) == {"verdict": "x"}
    # the curves mark where the watch would have stopped (b), over the loss of a uniform guess; no speed
    # plot without a served accept histogram (speed_tables stood in: none)
    assert stages["plots"] == [("curves", "curves.png", math.log(cfg.draft_vocab_size), 12),
                               ("bars", "cond_acc_k.png", cfg.ttt_steps)]
    # every drafter, the source zero-shot and n-gram lookup too, served on the tuned target's eval prompts
    assert {(t, p) for _, t, p in stages["served"]} == {("tuned", "prompts-eval.jsonl")}
    assert [d for d, _, _ in stages["served"]][:5] == [a["out"] for a in arms] + [source["out"]]
    assert level["source_served_zero_shot"] == {"drafter": source["out"]}
    assert (level["ngram_served"]["drafter"].across_prompts, level["ngram_across_served"]["drafter"].across_prompts) \
        == (False, True)
    assert [a.transfer for a in level["arms"]] == [None] + [{"from": str(source["out"])}] * 3
    # the probe: the source drafter on the tuned target, its pilot the arms' recipe at the transfer rate
    (p,) = stages["probe"]
    assert (p["source"], p["target"], p["features"], p["base"]) == (source["out"], "tuned", "tuned", "base")
    assert (p["pilot_steps"], p["ttt_steps"]) == (cfg.probe_pilot_steps, cfg.ttt_steps)
    assert p["recipe"] == study._train_config(cfg, cfg.arm_steps)
    assert (p["pilot_dir"], p["transfer_lr_scale"]) == (tmp_path / "level" / "probe-pilot", 0.1)


def test_the_speed_plot_prices_the_served_drafters(tmp_path, stages, monkeypatch):
    monkeypatch.setattr(report, "speed_tables", lambda level: [{"tables": {1.0: []}, "label": "x"}])
    study.run_level(dataclasses.replace(get_config("smoke"), device="cpu"), 1.0, tmp_path / "level", tmp_path / "c")
    assert stages["plots"][-1] == ("speed", "speed.png", [{"tables": {1.0: []}, "label": "x"}])


def test_the_arms_train_with_the_studys_threads(tmp_path, stages, monkeypatch):
    monkeypatch.setattr(study, "data_record", lambda level: {})
    monkeypatch.setattr(report, "render", lambda *a: "report\n")
    monkeypatch.setattr(report, "results_json", lambda *a: {})
    before = torch.get_num_threads()
    threads = 2 if before != 2 else 1
    study.run_study(dataclasses.replace(get_config("smoke"), device="cpu", threads=threads), tmp_path / "runs",
                    tmp_path / "c", run_dir=tmp_path / "d")
    assert {c["threads"] for c in stages["train"]} == {threads} and torch.get_num_threads() == before


def test_the_served_evaluation_is_greedy_at_the_studys_seed_and_length(tmp_path, monkeypatch):
    from drafter_lab.spec import eval as spec_eval

    target = type("T", (), {"device": torch.device("meta")})()
    monkeypatch.setattr("drafter_lab.targets.hf.load_target", lambda path, device="cpu": target)
    monkeypatch.setattr("drafter_lab.drafter.checkpoint.load_drafter", lambda path, target=None, device="cpu": "d")
    monkeypatch.setattr("drafter_lab.data.conversations.read_conversations", lambda path, **kw: (list("abcde"), {}))
    monkeypatch.setattr(spec_eval, "evaluate", lambda target, drafter, convs, **kw: kw)
    cfg = dataclasses.replace(get_config("smoke"), served_eval=True, seed=9, max_new_tokens=17, regen_temperature=0.7)
    got = study._served(cfg, tmp_path / "drafter", tmp_path / "target", tmp_path / "prompts.jsonl")
    assert (got["temperature"], got["seed"], got["max_new_tokens"], got["topk"], got["batch"]) == (0.0, 9, 17, 1, 1)


def test_no_ngram_baseline_serves_no_lookup(tmp_path, stages):
    cfg = dataclasses.replace(get_config("smoke"), device="cpu", ngram_baseline=False)
    level = study.run_level(cfg, 1.0, tmp_path / "level", tmp_path / "cache")
    assert level["ngram_served"] is None and level["ngram_across_served"] is None
    assert len(stages["served"]) == len(cfg.arms) + 1


def test_the_source_drafter_is_trained_once_then_reused(tmp_path, stages):
    cfg = dataclasses.replace(get_config("smoke"), device="cpu")
    study.run_level(cfg, 1.0, tmp_path / "one", tmp_path / "cache")
    study.run_level(cfg, 1.0, tmp_path / "two", tmp_path / "cache")
    outs = [c["out"] for c in stages["train"]]
    assert sum(o.parent.name == "source-drafters" for o in outs) == 1
    assert [o for o in outs if o.parent.name == "arms"] == [tmp_path / d / "arms" / k for d in ("one", "two")
                                                            for k in cfg.arms]


def test_each_level_of_a_sweep_keeps_its_arms_histories(tmp_path, monkeypatch, stages):
    monkeypatch.setattr(study, "data_record", lambda level: {})
    monkeypatch.setattr(plots, "drift_sweep", lambda points, path: None)
    monkeypatch.setattr(report, "render", lambda *a: "report\n")
    monkeypatch.setattr(report, "sweep_points", lambda levels: [])
    monkeypatch.setattr(report, "results_json", lambda *a: {})
    cfg = dataclasses.replace(get_config("drift-sweep"), device="cpu", drift_levels=[0.0, 1.0])
    run = study.run_study(cfg, tmp_path / "runs", tmp_path / "cache", run_dir=tmp_path / "d")
    for level in ("drift-0", "drift-1"):
        for key in cfg.arms:
            assert json.loads((run / level / f"metrics-{key}.jsonl").read_text())["step"] == cfg.arm_steps
    assert not list(run.glob("metrics-*.jsonl")) and not list(run.glob("drift-*/metrics-c.jsonl"))  # arms a, b only
    # the manifest it ends with records each level's data (a resume's check reads its config)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["data"] == {"drift-0": {}, "drift-1": {}} and manifest["config"]["drift_levels"] == [0.0, 1.0]
    assert json.loads((run / "results.json").read_text()) == {}


@pytest.mark.parametrize("name, drift_levels", [("smoke", [1.0, 4.0]), ("drift-sweep", [0.5])])
def test_a_single_level_study_resumed_as_a_sweep_or_back_is_refused(tmp_path, levels, name, drift_levels):
    """One level trains in the run directory itself, a sweep's in drift-* below it: resuming one as the
    other would train every arm again beside the ones it has."""
    from drafter_lab.config import to_dict

    cfg = dataclasses.replace(get_config(name), device="cpu")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"config": to_dict(cfg), "device": {"type": "cpu"}}))
    with pytest.raises(LabError, match=r"another config \(drift_levels differ\)"):
        study.run_study(dataclasses.replace(cfg, drift_levels=drift_levels), tmp_path / "runs", tmp_path / "c",
                        run_dir=tmp_path / "d")
    assert levels == []


@pytest.mark.parametrize("field, value", [("lr", 1e-3), ("batch_size", 2), ("max_length", 32), ("eval_every", 5),
                                          ("ttt_steps", 2), ("draft_vocab_size", 128), ("seed", 3),
                                          ("transfer_lr_scale", 0.5), ("source_steps", 40), ("max_new_tokens", 16)])
def test_a_resume_refuses_what_would_train_another_arm_or_source(field, value):
    """An arm resumed with another recipe refuses only after the data and probe stages (minutes); the
    data's and source drafter's settings make other caches, then arms that refuse their features."""
    from drafter_lab.config import to_dict

    cfg = dataclasses.replace(get_config("smoke"), device="cpu")
    assert getattr(cfg, field) != value
    assert study.config_changes(to_dict(cfg), dataclasses.replace(cfg, **{field: value}), "cpu") == [field]


def test_arm_d_only_with_a_strength_and_the_study_seed_in_every_recipe():
    cfg = dataclasses.replace(get_config("tiny-cpu"), l2sp=0.0, seed=11)
    assert [a.key for a in study.arms_for(cfg)] == cfg.arms
    assert study._train_config(cfg, 5).seed == 11


def test_features_captured_on_the_cpu_keep_the_key_they_had_before_devices_were_keyed(tmp_path, monkeypatch):
    """Pinned: a change of the CPU's key would capture every cached feature set again (hours on a real
    target); another device type samples otherwise, so it gets a key of its own."""
    import torch

    from drafter_lab.targets import fingerprint

    monkeypatch.setattr(fingerprint, "fingerprint", lambda d: "fp")
    monkeypatch.setattr(fingerprint, "legacy_fingerprint", lambda d: "legacy")
    monkeypatch.setattr(study, "prepare_features", lambda *a, **kw: None)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("{}\n")
    cfg = dataclasses.replace(get_config("smoke"), device="cpu")
    cpu = study._features(tmp_path / "t", prompts, tmp_path / "cache", cfg)
    assert cpu == tmp_path / "cache" / "features" / "befb46e43b6ced7e"  # no device in it
    monkeypatch.setattr(study, "resolve_device", lambda d: torch.device("cuda"))
    assert study._features(tmp_path / "t", prompts, tmp_path / "cache", cfg).name not in (cpu.name, "")


@pytest.mark.parametrize("levels_recorded", [3, "1.0", None])
def test_a_manifest_whose_drift_levels_are_no_list_is_refused_in_one_line(tmp_path, levels, levels_recorded):
    """A hand-edited manifest's drift_levels 3 was a TypeError's traceback (its len() taken)."""
    from drafter_lab.config import to_dict

    cfg = dataclasses.replace(get_config("drift-sweep"), device="cpu")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"config": {**to_dict(cfg), "drift_levels": levels_recorded}}))
    with pytest.raises(LabError, match=r"another config \(drift_levels differ\)"):
        study.run_study(cfg, tmp_path / "runs", tmp_path / "c", run_dir=tmp_path / "d")
    assert levels == []
