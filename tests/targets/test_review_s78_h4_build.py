"""Review s78 (h4) of targets/build.py, third mutation pass: each stage's seconds on build.py's own clock
(in pair.json and in each cache entry's build.json), drift measured on models in eval mode, what the pair
records of a config that is no preset, the out_dir replaced only when it holds a pair, and the modes a
usual umask gives the pair; presets.resolve."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import types

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets import build as build_mod
from drafter_lab.targets.presets import PRESETS, resolve


def _train(model, sources, **kw):
    """train_lm's record of a run, without running it."""
    return {"steps": kw["steps"], "tokens": 0, "first_loss": None, "final_loss": None, "seconds": 0.0}


def test_each_part_is_one_interval_of_the_clock_in_hundredths(tmp_path, monkeypatch):
    """The clock reads a third of a second later each time: each part is its end less its start (0.33), in
    pair.json and in the build.json of the entry that spent it; this_call spans the whole call."""
    reads = []
    monkeypatch.setattr(build_mod, "time", types.SimpleNamespace(
        perf_counter=lambda: reads.append(100 + len(reads) / 3) or reads[-1]))
    monkeypatch.setattr(build_mod, "train_lm", _train)
    cfg = dataclasses.replace(PRESETS["micro"], tune_steps=2, threads=0)
    pair = build_mod.build_pair(cfg, str(tmp_path / "pair"), cache_dir=tmp_path / "cache")  # a str out_dir too
    assert pair["build_seconds"] == {"corpus": 0.33, "tokenizer": 0.33, "base": 0.0, "tuned": 0.0, "drift": 0.33,
                                     "this_call": round(reads[-1] - reads[0], 2)}
    assert pair["build_seconds"]["this_call"] > 1
    entry = {stage: json.loads((tmp_path / "cache" / f"{stage}-{key}" / "build.json").read_text())["seconds"]
             for stage, key in (("base", pair["base_key"]), ("tuned", pair["key"]))}
    assert entry == {"base": {"corpus": 0.33, "tokenizer": 0.33, "base": 0.0}, "tuned": {"tuned": 0.0, "drift": 0.33}}
    assert pair["preset"] is None  # micro with other fine-tune steps is no preset
    assert pair["torch_threads"] == torch.get_num_threads() == 1  # threads 0: torch's own count (the conftest's)


def test_drift_is_measured_with_both_models_in_eval_mode(tmp_path, monkeypatch):
    """Whatever mode the fine-tune leaves tuned in: in train mode, dropout would move the figures."""
    def train(model, sources, **kw):
        model.train()  # as a trainer that leaves its model as it trained it
        return _train(model, sources, **kw)

    modes, real = [], build_mod.measure_drift

    def measure(base, tuned, batches):
        modes.append((base.training, tuned.training))
        return real(base, tuned, batches)

    monkeypatch.setattr(build_mod, "train_lm", train)
    monkeypatch.setattr(build_mod, "measure_drift", measure)
    pair = build_mod.build_pair(dataclasses.replace(PRESETS["micro"], tune_steps=2), tmp_path / "pair",
                                cache_dir=tmp_path / "cache")
    assert pair["tuned"]["train"]["steps"] == 2 and modes == [(False, False)] * 3


def test_a_usual_umask_gives_the_pair_its_modes(tmp_path):
    """Files 0644 and dirs 0755 under umask 022, from the private modes of the temp dirs they were built in."""
    root = tmp_path / "pair"
    (root / "base").mkdir(parents=True)
    for name in ("base/config.json", "pair.json"):
        (root / name).write_text("{}")
        (root / name).chmod(0o600)
    for path in (root, root / "base"):
        path.chmod(0o700)
    umask = os.umask(0o022)
    try:
        build_mod._usual_permissions(root)
    finally:
        os.umask(umask)
    modes = {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in (root, *root.rglob("*"))}
    assert modes == {".": 0o755, "base": 0o755, "base/config.json": 0o644, "pair.json": 0o644}


def test_an_out_dir_holding_anything_but_a_pair_is_refused(tmp_path):
    """Each build replaces out_dir whole: a directory of someone's files is refused, one holding a pair taken."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(LabError) as e:
        build_mod._check_out_dir(out, cache)
    assert str(e.value) == f"{out}: exists and is not a target-pair directory (no pair.json); refusing to replace it"
    (out / "pair.json").write_text("{}")
    build_mod._check_out_dir(out, cache)  # an earlier pair, of whatever key: replaced whole


def test_resolve_gives_a_config_as_is_a_preset_by_name_and_refuses_another_name():
    cfg = dataclasses.replace(PRESETS["micro"], seed=7)
    assert resolve(cfg) is cfg and resolve("micro") is PRESETS["micro"]
    with pytest.raises(LabError) as e:
        resolve("huge")
    assert str(e.value) == f"unknown preset 'huge'; known: {', '.join(PRESETS)}"
