"""`targets build` with odd inputs: a seed torch cannot take, and an out_dir whose pair.json names this
pair while the pair beside it is not whole (a deleted weights file, a pair.json of another shape)."""

from __future__ import annotations

import json

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.targets import build as build_mod
from drafter_lab.targets.build import build_pair
from drafter_lab.targets.presets import TargetConfig


@pytest.mark.parametrize("seed", [2**64 - 1, 10**23, -(2**63) - 1])
def test_a_seed_torch_cannot_take_is_one_line_before_the_build(tmp_path, capsys, seed):
    """torch.manual_seed raised "Overflow when unpacking long long" after the corpus and tokenizer."""
    with pytest.raises(LabError, match="seed must be in"):
        TargetConfig(seed=seed)
    toml = tmp_path / "c.toml"
    toml.write_text(f"seed = {seed}\n")
    assert main(["targets", "build", "--config", str(toml), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed must be in" in err[0] and not (tmp_path / "out").exists()
    TargetConfig(seed=2**64 - 2)  # tuned's seed + 1 still fits


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("review3")
    out, cache = root / "pair", root / "cache"
    return out, cache, build_pair("micro", out, drift=1.0, cache_dir=cache)


def _no_training(*args, **kwargs):
    raise AssertionError("trained again: the stages are cached")


def test_a_pair_missing_a_weights_file_is_rebuilt_not_reused(built, monkeypatch):
    """It was returned as cached, naming the fingerprint of what was left: a base without weights."""
    out, cache, info = built
    monkeypatch.setattr(build_mod, "train_lm", _no_training)
    (out / "base" / "model.safetensors").unlink()
    again = build_pair("micro", out, drift=1.0, cache_dir=cache)
    assert (out / "base" / "model.safetensors").is_file()
    assert again["base"]["fingerprint"] == info["base"]["fingerprint"]
    assert json.loads((out / "pair.json").read_text())["base"]["fingerprint"] == info["base"]["fingerprint"]


@pytest.mark.parametrize("edit", ["list", "no build_seconds", "base not an object"])
def test_a_pair_json_of_another_shape_is_rebuilt_not_a_traceback(built, monkeypatch, edit):
    out, cache, info = built
    monkeypatch.setattr(build_mod, "train_lm", _no_training)
    written = json.loads((out / "pair.json").read_text())
    bad = {"list": [written["key"]], "no build_seconds": {k: v for k, v in written.items() if k != "build_seconds"},
           "base not an object": {**written, "base": "base"}}[edit]
    (out / "pair.json").write_text(json.dumps(bad))
    again = build_pair("micro", out, drift=1.0, cache_dir=cache)
    assert again["key"] == info["key"] and json.loads((out / "pair.json").read_text())["key"] == info["key"]
