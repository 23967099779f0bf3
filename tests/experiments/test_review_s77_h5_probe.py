"""Mutation audit (review s77, h5) of the probe's flow: --val-data naming --data is refused only where a
pilot trains on that data (a pilot of one step too), and the reuse reason names the readable sequences
only where the zero-shot figure was taken over them for a reuse verdict."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.experiments import probe as probe_mod
from drafter_lab.experiments.config import ProbeConfig, ProbeThresholds
from drafter_lab.experiments.probe import probe

QUICK = ProbeConfig(max_sequences=4, pilot_steps=0, cka_tokens=32, ttt_steps=2)


def test_without_a_pilot_the_data_itself_may_be_the_validation_set(source, random_llama, features):
    """Nothing trains on it then: every signal reads both of its splits."""
    out = probe(source, random_llama, features, cfg=QUICK, val_data=features)
    assert out["val_data"] == str(features) and out["held_out_sequences"] == QUICK.max_sequences


def test_a_pilot_of_one_step_on_the_data_it_validates_on_is_refused_before_any_signal(source, random_llama, features,
                                                                                      monkeypatch):
    monkeypatch.setattr(probe_mod, "evaluate", lambda *a, **k: pytest.fail("a signal was measured"))
    with pytest.raises(LabError, match="--val-data is the --data path"):
        probe(source, random_llama, features, cfg=ProbeConfig(max_sequences=4, pilot_steps=1), val_data=features)


def _home_accept(monkeypatch, accept: float) -> None:
    """Home accept fixed at `accept` (a drafter of 4 steps may accept nothing, which is no basis for reuse)."""
    real = probe_mod._at_home

    def at_home(*args):
        home, ckas = real(*args)
        return {**home, "simulated_accept_len": accept}, ckas
    monkeypatch.setattr(probe_mod, "_at_home", at_home)


def test_one_tokenizer_reuses_over_every_sequence_without_naming_them(source, random_llama, features, monkeypatch):
    _home_accept(monkeypatch, 0.5)
    out = probe(source, random_llama, features, random_llama, cfg=QUICK, thresholds=ProbeThresholds(reuse_fraction=0))
    assert out["verdict"] == "reuse as is" and out["reason"].endswith("of home accept 0.50 (>= 0%)"), out["reason"]


def test_no_reuse_over_the_readable_sequences_names_them_not(source, next_version, random_llama, monkeypatch):
    """The suffix qualifies the reuse ratio; another verdict's reason does not quote it."""
    new, feats = next_version
    _home_accept(monkeypatch, 1e9)
    out = probe(source, new, feats, random_llama, cfg=QUICK)
    assert out["zero_shot_home_sequences"] is not None and out["verdict"] != "reuse as is"
    assert "held-out sequences the source target can read" not in out["reason"], out["reason"]
