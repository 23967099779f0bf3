"""Review s65 of targets/build.py and targets/presets.py, without training: the held-out split with odd
counts, what the base cache key covers, the drift figures' labels, a cache entry's or out_dir's state said
in one line, and the config limits at their edges."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets import build as build_mod
from drafter_lab.targets.presets import PRESETS, SMALLEST_VOCAB, TargetConfig


def test_heldout_split_with_odd_counts_gives_each_part_its_size_and_no_overlap():
    cfg = TargetConfig(train_prompts=5, eval_prompts=3, drift_conversations=2)
    n = cfg.heldout_per_slice  # exactly what the corpus holds out per slice
    corpus = SimpleNamespace(heldout_base=[{"id": f"b{i}"} for i in range(n)],
                             heldout_shifted=[{"id": f"s{i}"} for i in range(n)])
    split = build_mod._heldout_split(cfg, corpus)
    ids = {part: [r["id"] for r in records] for part, records in split.items()}
    assert ids["eval"] == ["b0", "s0", "b1"]  # the slices alternate, cut to the count asked
    assert ids["drift_base"] == ["b2", "b3"] and ids["drift_shifted"] == ["s2", "s3"]
    assert ids["train"] == ["b4", "s4", "b5", "s5", "b6"]
    every = [i for part in ids.values() for i in part]
    assert len(every) == len(set(every))


def test_base_fields_leave_out_exactly_the_fine_tune():
    """The base cache key: a drift sweep or another fine-tune reuses base; any other field retrains it."""
    cfg = PRESETS["micro"]
    for field, value in (("tune_steps", 7), ("tune_lr", 0.5), ("tune_shifted_fraction", 0.5), ("drift", 0.25)):
        assert dataclasses.replace(cfg, **{field: value}).base_fields() == cfg.base_fields(), field
    for field, value in (("seed", 1), ("base_lr", 0.5), ("vocab_size", 600), ("train_prompts", 17)):
        assert dataclasses.replace(cfg, **{field: value}).base_fields() != cfg.base_fields(), field


class _Stop(Exception):
    pass


@pytest.fixture
def base_entry(tmp_path, monkeypatch):
    """`base_entry(config, files=None)`: the name of the base cache entry build_pair would train."""
    def stop(cfg, corpus, key, dest, device):
        raise _Stop(dest.name)

    monkeypatch.setattr(build_mod, "_build_base", stop)
    real = build_mod.corpus_mod.source_files

    def entry(config, edit=None):
        files = real(config.corpus_max_files)
        monkeypatch.setattr(build_mod.corpus_mod, "source_files", lambda n: edit(files) if edit else files)
        with pytest.raises(_Stop) as e:
            build_mod.build_pair(config, tmp_path / "out", cache_dir=tmp_path / "cache")
        return str(e.value)

    return entry


def test_the_base_entry_follows_the_corpus_content_not_the_fine_tune(base_entry):
    micro = PRESETS["micro"]
    first = base_entry(micro)
    assert first.startswith("base-")
    assert base_entry(dataclasses.replace(micro, drift=0.5, tune_lr=0.5)) == first

    def one_byte_more(files):
        return [dataclasses.replace(files[0], data=files[0].data + b"\n"), *files[1:]]

    assert base_entry(micro, one_byte_more) != first  # an edited snapshot is not the base trained before
    assert base_entry(dataclasses.replace(micro, seed=1)) != first


def test_drift_figures_measure_each_text_on_its_own_inputs(monkeypatch):
    def measure(base, tuned, batches):
        assert all(len(b) <= build_mod.DRIFT_BATCH for b in batches)
        return torch.cat(batches)

    monkeypatch.setattr(build_mod, "measure_drift", measure)
    inputs = {"base": torch.arange(40).view(10, 4), "shifted": 100 + torch.arange(12).view(3, 4)}
    seen = build_mod._drift_figures(None, None, inputs)
    assert torch.equal(seen["base_text"], inputs["base"]) and torch.equal(seen["shifted_text"], inputs["shifted"])
    assert torch.equal(seen["all"], torch.cat([inputs["base"], inputs["shifted"]]))


def test_default_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTER_LAB_CACHE", str(tmp_path))
    assert build_mod.default_cache_dir() == tmp_path / "targets"
    monkeypatch.delenv("DRAFTER_LAB_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build_mod.default_cache_dir() == tmp_path / "home" / ".cache" / "drafter_lab" / "targets"


def test_out_dir_that_is_a_file_is_refused_and_an_empty_one_taken(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(LabError) as e:
        build_mod._check_out_dir(afile, tmp_path / "cache")
    assert str(e.value) == f"{afile}: exists and is not a directory"
    (tmp_path / "empty").mkdir()
    build_mod._check_out_dir(tmp_path / "empty", tmp_path / "cache")  # a directory made for the pair


@pytest.fixture
def logged(monkeypatch):
    lines = []
    monkeypatch.setattr(build_mod, "log", lines.append)
    return lines


@pytest.mark.parametrize("record,why", [
    ({"fingerprint": "0" * 16}, "its build.json is unreadable, or from an older drafter_lab"),  # no "files"
    ({"fingerprint": "0" * 16, "files": {"prompts-eval.jsonl": "0" * 64}}, "prompts-eval.jsonl is missing or unreadable"),
    ({"fingerprint": "0" * 16, "files": {"build.json": "0" * 64}}, "build.json has changed"),
])
def test_a_cache_entry_not_as_recorded_is_said_in_one_line_and_rebuilt(tmp_path, logged, record, why):
    stage = tmp_path / "base-0123"
    stage.mkdir()
    (stage / "build.json").write_text(json.dumps(record))
    assert build_mod._cached_stage(stage, "base") is None
    assert logged == [f"base: rebuilding the cache entry {stage}: {why}"]


def test_a_records_null_ckas_read_as_nan(tmp_path):
    """write_json writes NaN (a CKA of no variance) as null: read back, it is NaN for the tables again."""
    path = tmp_path / "pair.json"
    path.write_text(json.dumps({"drift_figures": {"all": {"cka": [None, 0.5], "kl": 0.25}}}))
    cka = build_mod._read_record(path)["drift_figures"]["all"]["cka"]
    assert math.isnan(cka[0]) and cka[1] == 0.5


@pytest.mark.parametrize("fields", [
    {"seed": -(2**63)}, {"seed": 2**64 - 2}, {"vocab_size": SMALLEST_VOCAB}, {"tune_shifted_fraction": 0.0},
    {"tune_shifted_fraction": 1.0}, {"seq_len": 2048, "max_position_embeddings": 2048}, {"num_layers": 8},
    {"max_source_chars": 1},
])
def test_config_values_at_their_limits_are_taken(fields):
    TargetConfig(**fields)


@pytest.mark.parametrize("fields,says", [
    ({"num_layers": 7}, "num_layers must be >= 8 for distinct aux layers, got 7"),
    ({"num_kv_heads": 3}, "need hidden_size % num_heads == 0 and num_heads % num_kv_heads == 0, got 128/4/3"),
    ({"hidden_size": 130}, "need hidden_size % num_heads == 0 and num_heads % num_kv_heads == 0, got 130/4/2"),
    ({"seed": 2**64 - 1}, f"seed must be in {-(2**63)}..{2**64 - 2}, got {2**64 - 1}"),
    ({"vocab_size": SMALLEST_VOCAB - 1}, f"vocab_size must be >= {SMALLEST_VOCAB} (the 256 bytes and the special "
                                         f"tokens), got {SMALLEST_VOCAB - 1}"),
])
def test_config_values_past_their_limits_are_refused(fields, says):
    with pytest.raises(LabError) as e:
        TargetConfig(**fields)
    assert str(e.value) == says

