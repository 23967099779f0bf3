"""`targets build` reuses only what is whole: a stage-cache entry or an out_dir with a file deleted, cut
short or edited since it was built is rebuilt (the entry) or copied again (out_dir), not passed on; and
config values that could only fail after the corpus is read are refused first."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from drafter_lab import cli
from drafter_lab.targets import build as build_mod
from drafter_lab.targets.build import build_pair


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    out, cache = root / "pair", root / "cache"
    return out, cache, build_pair("micro", out, drift=1.0, cache_dir=cache)


@pytest.fixture
def copy(built, tmp_path):
    """The built pair and its cache, copied: each test damages its own."""
    out, cache, info = built
    shutil.copytree(out, tmp_path / "pair")
    shutil.copytree(cache, tmp_path / "cache")
    return tmp_path / "pair", tmp_path / "cache", info


@pytest.fixture
def logged(monkeypatch):
    lines = []
    monkeypatch.setattr(build_mod, "log", lines.append)
    return lines


def _entry(cache, info, stage):
    return cache / f"{stage}-{info['base_key' if stage == 'base' else 'key']}"


def _delete(f):
    f.unlink()


def _cut_short(f):
    os.truncate(f, f.stat().st_size // 2)  # a full disk


@pytest.mark.parametrize("stage,name,damage", [
    ("base", "model.safetensors", _delete),  # was copied on: a base without weights, under a new fingerprint
    ("tuned", "model.safetensors", _cut_short),  # was a LabError naming the cache file, until --force
    ("tuned", "tokenizer.json", _delete),  # was copied on: a tuned target without its tokenizer
])
def test_a_damaged_cache_entry_is_rebuilt_not_copied(copy, tmp_path, logged, stage, name, damage):
    _, cache, info = copy
    entry = _entry(cache, info, stage)
    damage(entry / "model" / name)
    out = tmp_path / "new"
    again = build_pair("micro", out, drift=1.0, cache_dir=cache)
    assert not again[stage]["cached"]
    assert any(line.startswith(f"{stage}: rebuilding the cache entry {entry}: ") for line in logged)
    for side in ("base", "tuned"):  # CPU builds repeat bit for bit: the rebuilt entry is the one damaged
        assert again[side]["fingerprint"] == info[side]["fingerprint"]
        assert (out / side / name).read_bytes() == (_entry(cache, info, side) / "model" / name).read_bytes()
    assert (out / stage / name).stat().st_size == (tmp_path / "pair" / stage / name).stat().st_size


def test_a_tuned_entry_fine_tuned_from_another_base_is_rebuilt(copy, tmp_path, logged, monkeypatch):
    """A base rebuilt with other weights (--force on a GPU, another torch) left the other drifts' tuned
    entries in the cache; each was paired with the new base, though fine-tuned from the old one."""
    _, cache, info = copy
    real = build_mod.train_lm

    def other_weights(model, *args, **kwargs):
        stats = real(model, *args, **kwargs)
        with torch.no_grad():
            model.lm_head.weight.add_(0.01)
        return stats

    monkeypatch.setattr(build_mod, "train_lm", other_weights)
    other = build_pair("micro", tmp_path / "zero", drift=0.0, cache_dir=cache, force=True)  # trains base only
    assert other["base"]["fingerprint"] != info["base"]["fingerprint"]
    monkeypatch.setattr(build_mod, "train_lm", real)
    again = build_pair("micro", tmp_path / "one", drift=1.0, cache_dir=cache)
    assert again["base"]["cached"] and not again["tuned"]["cached"]
    assert f"tuned: rebuilding the cache entry {_entry(cache, info, 'tuned')}: fine-tuned from another build of base" in logged
    tuned = json.loads((_entry(cache, info, "tuned") / "build.json").read_text())
    assert tuned["base_fingerprint"] == other["base"]["fingerprint"]


def _no_training(*args, **kwargs):
    raise AssertionError("trained again: the stages are cached")


@pytest.mark.parametrize("name,damage", [
    ("tuned/tokenizer.json", _delete),  # the fingerprint covers config and weights only
    ("base/tokenizer_config.json", _cut_short),
    ("prompts-eval.jsonl", lambda f: f.write_text("")),
])
def test_a_damaged_out_dir_is_copied_again_not_called_up_to_date(copy, monkeypatch, name, damage):
    out, cache, info = copy
    whole = (out / name).read_bytes()
    damage(out / name)
    monkeypatch.setattr(build_mod, "train_lm", _no_training)
    again = build_pair("micro", out, drift=1.0, cache_dir=cache)
    assert (out / name).read_bytes() == whole
    assert again["base"]["cached"] and again["tuned"]["cached"]
    assert json.loads((out / "pair.json").read_text())["tuned"]["fingerprint"] == info["tuned"]["fingerprint"]
    lines = []
    monkeypatch.setattr(build_mod, "log", lines.append)
    build_pair("micro", out, drift=1.0, cache_dir=cache)
    assert lines == [f"cached: {out} already holds this pair (key {info['key']})"]


@pytest.fixture
def no_corpus(monkeypatch):
    def read(*args, **kwargs):
        raise AssertionError("the corpus was read: the setting should have been refused first")

    monkeypatch.setattr(build_mod.corpus_mod, "build_corpus", read)


@pytest.mark.parametrize("flags,says", [
    # each was "corpus too small: the base slice has 0 conversations", which raising corpus_max_files never fixes
    (("--max-source-chars", "0"), "--max-source-chars must be >= 1, got 0"),
    (("--max-source-chars", "-5"), "--max-source-chars must be >= 1, got -5"),
    (("--shifted-share", "0"), "--shifted-share 0.0 leaves the shifted slice empty; it must be above 0 and below 1"),
    (("--shifted-share", "1"), "--shifted-share 1.0 leaves the base slice empty; it must be above 0 and below 1"),
    # rotary embeddings' "size of tensor a (3) must match ... (4)" traceback after the corpus and tokenizer
    (("--hidden-size", "12"), "--hidden-size / num_heads (the head size) must be even, got 12/4 = 3"),
])
def test_settings_that_fail_after_the_corpus_are_refused_first(tmp_path, capsys, no_corpus, flags, says):
    out = tmp_path / "pair"
    assert cli.main(["targets", "build", "--preset", "micro", "--out", str(out), "--cache-dir",
                     str(tmp_path / "cache"), *flags]) == 2
    assert capsys.readouterr().err.strip() == f"error: {says}"
    assert not out.exists()


def test_max_source_chars_in_a_config_file_names_the_file(tmp_path, capsys, monkeypatch, no_corpus):
    monkeypatch.setenv("DRAFTER_LAB_CACHE", str(tmp_path / "cache"))
    toml = tmp_path / "target.toml"
    toml.write_text("max_source_chars = 0\n")
    assert cli.main(["targets", "build", "--config", str(toml), "--out", str(tmp_path / "pair")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {toml}: max_source_chars must be >= 1, got 0"
