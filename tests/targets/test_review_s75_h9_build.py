"""Review s75 (h9) of targets/build.py, mutation pass: where the cache entries go (the cache_dir given, else
$DRAFTER_LAB_CACHE), the corpus parsed once for both stages, and `force` retraining both stages even into
an out_dir already holding the pair."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.targets import build as build_mod
from drafter_lab.targets.presets import PRESETS


class _Stop(Exception):
    pass


@pytest.fixture
def base_dest(tmp_path, monkeypatch):
    """`base_dest(cache_dir)`: the directory build_pair would train base into (stopped there)."""
    def stop(cfg, corpus, key, dest, device):
        raise _Stop(str(dest))

    monkeypatch.setattr(build_mod, "_build_base", stop)

    def dest(cache_dir):
        with pytest.raises(_Stop) as e:
            build_mod.build_pair("micro", tmp_path / "out", cache_dir=cache_dir)
        return str(e.value)

    return dest


def test_the_cache_is_the_dir_given_else_the_environments(base_dest, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTER_LAB_CACHE", str(tmp_path / "env"))
    given = base_dest(tmp_path / "given")
    assert given.startswith(str(tmp_path / "given" / "base-"))
    assert base_dest(None) == given.replace(str(tmp_path / "given"), str(tmp_path / "env" / "targets"))


def test_the_corpus_is_parsed_once_for_both_stages(monkeypatch):
    parsed = []

    def build_corpus(files, **kw):
        parsed.append(files)
        return object()

    monkeypatch.setattr(build_mod.corpus_mod, "build_corpus", build_corpus)
    corpus = build_mod._Corpus(PRESETS["micro"], ["a.py"], "0" * 64)
    first = corpus.get()
    assert corpus.get() is first and parsed == [["a.py"]]


def test_force_retrains_both_stages_into_an_out_dir_already_holding_the_pair(tmp_path, monkeypatch):
    """Without force the same call is up to date; with it, neither the pair nor a cached stage is reused."""
    calls = []

    def train(model, sources, **kw):
        calls.append(kw["description"])
        return {"steps": kw["steps"], "tokens": 0, "first_loss": None, "final_loss": None, "seconds": 0.0}

    monkeypatch.setattr(build_mod, "train_lm", train)
    cfg = dataclasses.replace(PRESETS["micro"], tune_steps=2)

    def build(force=False):
        return build_mod.build_pair(cfg, tmp_path / "pair", cache_dir=tmp_path / "cache", force=force)

    first = build()
    assert len(calls) == 2 and not first["base"]["cached"] and not first["tuned"]["cached"]
    again = build()
    assert len(calls) == 2 and again["base"]["cached"] and again["tuned"]["cached"]
    forced = build(force=True)
    assert calls[2:] == calls[:2]  # base, then tuned, trained again
    assert not forced["base"]["cached"] and not forced["tuned"]["cached"]
    assert forced["base"]["fingerprint"] == first["base"]["fingerprint"]  # the same build, retrained
