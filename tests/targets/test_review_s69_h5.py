"""Review s69 (h5) of targets/corpus.py and targets/build.py: a pair's build_seconds are what the call
spent, a stage taken from the cache counting none; the corpus' summary cap, empty snapshot and written
snapshot's members pinned."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import types

import pytest
import torch

from drafter_lab.targets import build as build_mod
from drafter_lab.targets import corpus as c
from drafter_lab.targets.build import PRESETS, build_pair

THREE = '''
def first(a):
    """The first of a, as a plain helper of this module returns it."""
    return a[0]


def last(a):
    """The last of a, as a plain helper of this module returns it."""
    return a[-1]


def middle(a):
    """The middle of a, as a plain helper of this module returns it."""
    return a[len(a) // 2]
'''


def _records(files, max_source_chars: int = 1200) -> dict[str, dict]:
    corpus = c.build_corpus(files, seed=0, shifted_share=0.5, heldout_per_slice=0, max_source_chars=max_source_chars)
    return {r["id"].split(":", 1)[1]: r for r in corpus.base + corpus.shifted}


def test_a_summary_is_cut_at_400_characters():
    """The literal, not MAX_SUMMARY_CHARS: another cap changes the conversations, and the pinned micro corpus
    (no first paragraph near 400 characters) would not ask for the FORMAT_VERSION bump that needs."""
    text = '\n\ndef long(x):\n    """' + "L" * 450 + '"""\n    return x\n'
    records = _records([c.SourceFile(f"m{k}.py", text.encode()) for k in range(8)])
    asks = [r["conversations"][0]["content"] for r in records.values() if r["slice"] == "base"]
    assert asks and all(ask.split("\n\n", 1)[1] == "L" * 400 for ask in asks)


def test_a_snapshot_without_python_files_is_one_line_naming_it(tmp_path):
    archive = tmp_path / "lib.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.addfile(tarfile.TarInfo("README.txt"), io.BytesIO(b""))
    with pytest.raises(c.LabError, match=r"lib\.tar\.xz: the corpus snapshot holds no Python sources"):
        c.source_files(source=archive)


def test_a_written_snapshot_holds_world_readable_files_owned_by_nobody_in_particular(tmp_path):
    """Extracted (to read or rebuild it), its files are readable by all, whoever wrote the archive."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "a.py").write_text("x = 1\n")
    (tmp_path / "lib" / "a.py").chmod(0o600)
    c.write_snapshot(tmp_path / "lib", tmp_path / "lib.tar.xz")
    with tarfile.open(tmp_path / "lib.tar.xz") as tar:
        (member,) = tar.getmembers()
    assert (member.name, member.mode, member.uid, member.uname, member.mtime) == ("a.py", 0o644, 0, "", 0)


def test_a_slice_of_one_conversation_more_than_held_out_is_enough():
    files = [c.SourceFile(f"m{k}.py", THREE.encode()) for k in range(8)]
    kw = {"seed": 0, "shifted_share": 0.5, "max_source_chars": 1200}
    full = c.build_corpus(files, heldout_per_slice=0, **kw)
    fewest = min(len(full.base), len(full.shifted))
    corpus = c.build_corpus(files, heldout_per_slice=fewest - 1, **kw)
    assert min(len(corpus.base), len(corpus.shifted)) == 1
    with pytest.raises(c.LabError, match="corpus too small"):
        c.build_corpus(files, heldout_per_slice=fewest, **kw)


def _clock(monkeypatch):
    """build.py's clock, read a third of a second later each time from 100 s on; its readings."""
    reads = []
    monkeypatch.setattr(build_mod, "time", types.SimpleNamespace(
        perf_counter=lambda: reads.append(100 + len(reads) / 3) or reads[-1]))
    return reads


def test_build_seconds_count_what_this_call_spent_a_cached_stage_none(tmp_path, monkeypatch):
    """A stage taken from the cache reported the seconds of the call that built it: a base trained for an
    hour once showed an hour in every later pair's build_seconds, beside a this_call of seconds."""
    cache = tmp_path / "cache"
    first = build_pair("micro", tmp_path / "one", drift=1.0, cache_dir=cache)
    assert not first["base"]["cached"] and first["build_seconds"]["base"] == first["base"]["train"]["seconds"]
    # Pinned, as the study's keys are: a change to what keys a stage orphans every cached pair. Change the
    # pin only with CODE_VERSION, the corpus' FORMAT_VERSION or a TargetConfig field that changes the pair.
    assert (first["format"], first["code_version"], first["base_key"], first["key"]) == (
        1, 1, "50afb5e9fbb33a71", "a15f3568a7788cda")
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == ["base-50afb5e9fbb33a71", "tuned-a15f3568a7788cda"]
    record = cache / "base-50afb5e9fbb33a71" / "build.json"
    info = json.loads(record.read_text())
    info["seconds"] = {"corpus": 3600.0, "tokenizer": 3600.0, "base": 3600.0}  # what an hour's build wrote
    info["train"]["seconds"] = 3600.0
    record.write_text(json.dumps(info))

    with monkeypatch.context() as m:
        reads = _clock(m)
        again = build_pair("micro", tmp_path / "two", drift=0.5, cache_dir=cache)  # base cached, tuned trained
    seconds = again["build_seconds"]
    assert again["base"]["cached"] and not again["tuned"]["cached"]
    assert seconds["tokenizer"] == seconds["base"] == 0.0 and again["base"]["train"]["seconds"] == 3600.0
    assert seconds["corpus"] == 0.33  # parsed by this call (two readings of the clock), to fine-tune tuned
    assert seconds["this_call"] == round(reads[-1] - reads[0], 2) == 1.67
    assert set(seconds) == {"corpus", "tokenizer", "base", "tuned", "drift", "this_call"}
    assert json.loads((tmp_path / "two" / "pair.json").read_text())["build_seconds"] == seconds

    both = build_pair("micro", tmp_path / "three", drift=0.5, cache_dir=cache)  # both cached: nothing parsed
    assert both["base"]["cached"] and both["tuned"]["cached"]
    assert {k: v for k, v in both["build_seconds"].items() if k != "this_call"} == dict.fromkeys(
        ("corpus", "tokenizer", "base", "tuned", "drift"), 0.0)

    pair_json = tmp_path / "two" / "pair.json"  # the pair itself up to date: its record is another call's
    written = json.loads(pair_json.read_text())
    pair_json.write_text(json.dumps({**written, "build_seconds": {**written["build_seconds"], "tuned": 3600.0}}))
    with monkeypatch.context() as m:
        _clock(m)
        up_to_date = build_pair("micro", tmp_path / "two", drift=0.5, cache_dir=cache)
    assert up_to_date["base"]["cached"] and up_to_date["tuned"]["cached"]
    assert up_to_date["build_seconds"] == {**dict.fromkeys(("corpus", "tokenizer", "base", "tuned", "drift"), 0.0),
                                           "this_call": 0.33}  # the lookup, between two readings
    assert json.loads(pair_json.read_text())["build_seconds"]["tuned"] == 3600.0  # the file is not rewritten


def test_the_pair_records_the_torch_threads_its_config_set_not_the_callers(tmp_path):
    """The stages train under the config's thread count; the record said the caller's (1 here) instead."""
    cfg = dataclasses.replace(PRESETS["micro"], threads=2, base_steps=1)
    assert torch.get_num_threads() == 1  # the targets' conftest
    assert build_pair(cfg, tmp_path / "pair", cache_dir=tmp_path / "cache")["torch_threads"] == 2
