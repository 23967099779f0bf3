"""Review s65 of targets/build.py on a built micro pair: an out_dir holding the pair of another drift is
rebuilt (not called up to date), the record names the preset and the fine-tune steps of the drift asked,
the pair gets the umask's modes, and a lower drift is exactly an earlier point of the same fine-tune."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil

import pytest

from drafter_lab.targets import build as build_mod
from drafter_lab.targets import train_lm as train_lm_mod
from drafter_lab.targets.build import PRESETS, build_pair


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("s65pair")
    out, cache = root / "pair", root / "cache"
    return out, cache, build_pair("micro", out, drift=1.0, cache_dir=cache)


def test_an_out_dir_holding_another_drift_is_rebuilt_and_names_the_preset(built, tmp_path):
    out, cache, first = built
    assert first["corpus"]["conversations"]["heldout_base"] == PRESETS["micro"].heldout_per_slice  # none unused
    shutil.copytree(out, tmp_path / "pair")
    out = tmp_path / "pair"
    again = build_pair("micro", out, drift=0.25, cache_dir=cache)
    assert again["key"] != first["key"] and json.loads((out / "pair.json").read_text())["key"] == again["key"]
    assert again["base"]["cached"] and not again["tuned"]["cached"]
    assert again["tuned"]["fingerprint"] != first["tuned"]["fingerprint"]
    # --drift on a preset still builds that preset, at that drift: round(0.25 * 6) fine-tune steps
    assert again["preset"] == "micro" and again["drift"] == again["config"]["drift"] == 0.25
    assert again["tuned"]["train"]["steps"] == round(0.25 * PRESETS["micro"].tune_steps) == 2


def test_the_pair_gets_the_umasks_modes(built):
    """Built in private temp dirs (0700/0600): others sharing the machine could not read the targets."""
    out, _, _ = built
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    for path in out.rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o777 if path.is_dir() else 0o666) & ~umask, path


class _Stop(Exception):
    pass


def test_a_lower_drift_is_an_earlier_point_of_the_same_fine_tune(built, tmp_path, monkeypatch):
    """The presets' docstring: drift 0.5 of 8 fine-tune steps is the 8-step run stopped after 4."""
    _, cache, _ = built
    cfg = dataclasses.replace(PRESETS["micro"], tune_steps=8)  # base is the micro one, cached
    half = build_pair(cfg, tmp_path / "half", drift=0.5, cache_dir=cache)
    assert half["base"]["cached"] and half["tuned"]["train"]["steps"] == 4

    @contextlib.contextmanager
    def stop_after_4(description, total):
        done = 0

        def advance(**kwargs):
            nonlocal done
            done += 1
            if done == 4 and description.startswith("fine-tune"):
                raise _Stop

        yield advance

    real = build_mod.train_lm

    def stopped(model, *args, **kwargs):
        assert kwargs["steps"] == 8
        with contextlib.suppress(_Stop):
            real(model, *args, **kwargs)
        return {"steps": 4, "tokens": 0, "first_loss": None, "final_loss": None, "seconds": 0.0}

    monkeypatch.setattr(train_lm_mod, "progress", stop_after_4)
    monkeypatch.setattr(build_mod, "train_lm", stopped)
    fresh = tmp_path / "cache"  # the base alone: the cut run's tuned entry must not land in the shared cache
    shutil.copytree(cache / f"base-{half['base_key']}", fresh / f"base-{half['base_key']}")
    cut = build_pair(cfg, tmp_path / "cut", drift=1.0, cache_dir=fresh)
    assert cut["base"]["cached"] and cut["tuned"]["fingerprint"] == half["tuned"]["fingerprint"]
