"""Capture, mutation audit s76/h7: check_config's other settings, the split's pinned hash, the
temperature a token-exact capture records, and which shard rows a resume keeps."""

from __future__ import annotations

import math

import pytest

from drafter_lab.data.capture import CaptureConfig, _kept, check_config, split_of, temperature_of
from drafter_lab.data.conversations import Conversation
from drafter_lab.data.shards import Manifest
from drafter_lab.errors import LabError


@pytest.mark.parametrize(("overrides", "message"), [
    ({"dtype": "float64"}, "unknown dtype 'float64'; choose one of float32, bfloat16, float16"),
    ({"temperature": -0.5}, "temperature must be a finite number >= 0, got -0.5"),
    ({"temperature": math.nan}, "temperature must be a finite number >= 0, got nan"),
    ({"temperature": math.inf}, "temperature must be a finite number >= 0, got inf"),
    ({"seed": 2**64}, f"seed must be in -2**63..2**64-1 (torch's 64-bit seeds), got {2**64}"),
    ({"turns": "first"}, "unknown turns 'first'; choose one of all, last, each"),
])
def test_a_bad_setting_is_refused_in_one_line(overrides, message):
    with pytest.raises(LabError) as e:
        check_config(CaptureConfig(**overrides))
    assert str(e.value) == message


def test_the_edges_of_each_setting_are_taken():
    counts = ("max_length", "batch_size", "shard_size", "max_new_tokens", "regen_batch_size", "tokenize_workers")
    check_config(CaptureConfig(**dict.fromkeys(counts, 1), temperature=0.0, dtype="float16", turns="each"))
    check_config(CaptureConfig(temperature=1e308, seed=2**64 - 1))


def test_the_split_is_pinned_to_the_conversation_ids_hash():
    """A rerun of an older capture must put each conversation where it did: the split is part of the
    shards a manifest lists (the first 64 bits of sha256(id), over 2**64, below val_fraction is val)."""
    ids = [f"c{i}" for i in range(10)]
    assert [split_of(c, 0.5) for c in ids] == ["val", "train", "train", "val", "val", "train", "val", "train", "val",
                                               "train"]
    # c0's hash lies at 0.070989... of the range
    assert (split_of("c0", 0.0709), split_of("c0", 0.0710), split_of("c0#turn3", 0.0710)) == ("train", "val", "val")


def _assistant(temperature=None, sampled=True):
    return {"role": "assistant", "content": "a", **({"token_ids": [1]} if sampled else {}),
            **({"temperature": temperature} if temperature is not None else {})}


@pytest.mark.parametrize(("messages", "want"), [
    ([[_assistant(0.7)], [_assistant(0.7), _assistant(0.7)]], 0.7),
    ([[_assistant(0.7)], [_assistant(0.0)]], None),  # two temperatures: none to record
    ([[_assistant(0.7), _assistant(0.0), _assistant(1.0)]], None),
    ([[_assistant(0.7), _assistant()]], None),  # one turn says nothing
    ([[_assistant(0.7), _assistant(0.0, sampled=False)]], 0.7),  # a turn kept as recorded was not sampled
    ([[{"role": "user", "content": "q", "token_ids": [1], "temperature": 0.0}, _assistant(0.7)]], 0.7),
    ([[{"role": "user", "content": "q"}]], None),
])
def test_the_temperature_recorded_is_that_of_every_sampled_answer(messages, want):
    convs = [Conversation(f"c{k}", [{"role": "user", "content": "q"}, *ms]) for k, ms in enumerate(messages)]
    assert temperature_of(convs) == want


def _rows(tmp_path, names):
    for name in names:
        (tmp_path / name).write_bytes(b"")
    return [{"file": name, "sequences": 1, "tokens": 2, "loss_tokens": 1, "sha256": "x"} for name in names]


def test_a_resume_keeps_the_rows_that_hold_their_plan_and_says_so_only_for_the_others(tmp_path, capsys):
    existing = Manifest(target={"fingerprint": "fp", "hidden_size": 4}, aux_layer_ids=[1, 2, 3], dtype="float32",
                        source={})
    train = _rows(tmp_path, ["train-00000.safetensors", "train-00001.safetensors"])
    val = _rows(tmp_path, ["val-00000.safetensors"])
    existing.shards = {"train": train, "val": val}
    plan = {"train": [["a"], ["b"]], "val": [["c"]]}
    capsys.readouterr()
    assert _kept(tmp_path, existing, plan, lambda path, chunk: True, True) == {"train": train, "val": val}
    assert capsys.readouterr().err == ""  # nothing stale: nothing to say
    assert _kept(tmp_path, existing, plan, lambda path, chunk: chunk != ["b"], False) == {"train": train[:1],
                                                                                          "val": val}
    assert capsys.readouterr().err == ""  # another rank: the main one says it
    # A row naming a shard the plan has not (a hand-edited manifest) is computed again, not looked up.
    existing.shards["train"] = [*train, *_rows(tmp_path, ["train-00002.safetensors"])]
    assert _kept(tmp_path, existing, plan, lambda path, chunk: True, True) == {"train": train, "val": val}
    assert "1 of 4 shards written hold other sequences" in capsys.readouterr().err


def _snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_rank_other_than_the_main_one_computes_every_shard_left_and_writes_nothing(tmp_path, capsys):
    """Under torchrun each rank runs every forward, rank 0 alone writes: another rank that saved the
    manifest, wrote a shard or cleared rank 0's half-written one would race it in a shared --out."""
    import torch

    from drafter_lab.data.capture import write_planned

    def item(name):
        return (name, torch.ones(2, dtype=torch.long), torch.ones(2, dtype=torch.bool))

    plan = {"train": [[item("a")], [item("b")], [item("c")]], "val": []}
    planned = {"train": {"sequences": 3, "shards": 3}, "val": {"sequences": 0, "shards": 0}}
    existing = Manifest(target={"fingerprint": "fp", "hidden_size": 4}, aux_layer_ids=[1, 2, 3], dtype="float32",
                        source={"planned": planned})
    # train-00001 landed; train-00002 is listed but gone (deleted since): both ranks compute it again
    existing.shards = {"train": _rows(tmp_path, ["train-00001.safetensors"]), "val": []}
    existing.shards["train"].append({**existing.shards["train"][0], "file": "train-00002.safetensors"})
    existing.save(tmp_path)
    (tmp_path / ".train-00000.safetensors.x1.tmp").write_bytes(b"rank 0 writing")
    before = _snapshot(tmp_path)
    computed = []

    def compute(chunk, advance, put):
        computed.append([it[0] for it in chunk])
        put(0, None)  # this rank's put keeps nothing

    fresh = Manifest(target=existing.target, aux_layer_ids=[1, 2, 3], dtype="float32", source={})
    capsys.readouterr()
    got = write_planned(tmp_path, fresh, Manifest.load(tmp_path), plan, torch.float32, lambda it: len(it[1]),
                        compute, main=False)
    assert computed == [["a"], ["c"]]
    assert [r["file"] for r in got.shards["train"]] == ["train-00001.safetensors"]
    assert _snapshot(tmp_path) == before and capsys.readouterr().err == ""


def test_a_default_capture_records_no_key_a_later_setting_added(features):
    """turns, token_exact, stop ids and sampled_at are recorded only where set: a manifest written before
    them (which has none) must still resume under the defaults."""
    import json

    source = json.loads((features / "manifest.json").read_text())["source"]
    assert not {"turns", "token_exact", "stop_token_ids", "sampled_at", "device"} & set(source)
    assert source["regenerate"] is None


def test_an_out_dir_holding_many_other_files_names_the_first_three(tmp_path):
    from drafter_lab.data.capture import check_out_dir

    for name in ("d.txt", "a.txt", "c.txt", "b.txt"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(LabError) as e:
        check_out_dir(tmp_path)
    assert str(e.value) == f"{tmp_path}: output directory holds other files (a.txt, b.txt, c.txt) and no manifest"


@pytest.mark.parametrize(("config", "overrides"), [
    (CaptureConfig(dtype="float64"), {}),
    (CaptureConfig(dtype="float64"), {"max_length": 64}),  # overrides go on top of the config, not the defaults
    (CaptureConfig(), {"dtype": "float64"}),
])
def test_prepare_checks_the_config_it_is_given_with_its_overrides_before_any_work(tmp_path, config, overrides):
    from drafter_lab.data.capture import prepare_features

    with pytest.raises(LabError, match="^unknown dtype 'float64'"):
        prepare_features(tmp_path / "no-model", tmp_path / "no.jsonl", tmp_path / "out", config, **overrides)
    assert not (tmp_path / "out").exists()


def test_two_ranks_load_the_target_tensor_parallel(tmp_path, monkeypatch):
    from data_helpers import make_conversations, write_jsonl

    from drafter_lab.data import capture

    def tp_load(path, dtype):
        raise LabError("loaded tensor-parallel", path)

    monkeypatch.setattr(capture, "_load_tp_target", tp_load)
    monkeypatch.setenv("WORLD_SIZE", "2")
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(1))
    with pytest.raises(LabError, match="loaded tensor-parallel"):
        capture.prepare_features(tmp_path / "model", convs, tmp_path / "out")
