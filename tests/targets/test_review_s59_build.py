"""Review of targets/build.py: an `--out` that is the current directory (`.`, or its own path)."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets import build as build_mod
from drafter_lab.targets.build import build_pair


def _no_training(*args, **kwargs):
    raise AssertionError("train_lm ran before the refusal")


def test_the_current_directory_as_out_is_refused_before_the_work(tmp_path, monkeypatch):
    """`--out .` was "ValueError: PosixPath('.') has an empty name" once both stages had trained; its own
    path swapped the directory away, and the shell was left in a deleted one (the next python failed)."""
    here = tmp_path / "pair"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(build_mod, "train_lm", _no_training)
    for out in (".", here):
        with pytest.raises(LabError, match="is \\(or holds\\) the current directory") as e:
            build_pair("micro", out, cache_dir=tmp_path / "cache")
        assert len(str(e.value).splitlines()) == 1
    assert not any(here.iterdir()) and not (tmp_path / "cache").exists()


def test_a_pair_already_there_is_still_found_from_inside_it(tmp_path, monkeypatch):
    """Nothing is replaced when the directory holds this pair: that stays a no-op, wherever it runs from."""
    info = build_pair("micro", tmp_path / "pair", cache_dir=tmp_path / "cache")
    monkeypatch.chdir(tmp_path / "pair")
    monkeypatch.setattr(build_mod, "train_lm", _no_training)
    again = build_pair("micro", ".", cache_dir=tmp_path / "cache")
    assert again["key"] == info["key"] and again["base"]["cached"] and again["tuned"]["cached"]
    with pytest.raises(LabError, match="current directory"):  # --force would replace it
        build_pair("micro", ".", cache_dir=tmp_path / "cache", force=True)
