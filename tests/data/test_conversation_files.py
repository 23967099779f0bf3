"""Conversation files as users hand them over: a JSON array (ShareGPT's own dump) or a gzip'd file is
read as its jsonl would be; a path that is a file where a directory belongs is named as such; and a
plain capture rerun with --regenerate is refused without a false "begun before" line."""

from __future__ import annotations

import codecs
import gzip
import json

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab.data.conversations import read_conversations
from drafter_lab.drafter.checkpoint import read_checkpoint
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, load_tokenizer


def _rows() -> list[dict]:
    rows = make_conversations(5)
    rows.insert(1, {"conversations": [{"from": "human", "value": "anyone?"}]})  # no answer: skipped
    rows.append(rows[2])  # the same chat twice: kept once
    return rows


def _read(path):
    convs, skipped = read_conversations(path)
    return [(c.id, c.messages, c.tools) for c in convs], skipped


@pytest.mark.parametrize("dump", [lambda rows: json.dumps(rows, indent=2),  # ShareGPT's dump
                                  lambda rows: " \n" + json.dumps(rows),  # one line, after whitespace
                                  lambda rows: codecs.BOM_UTF8.decode() + json.dumps(rows)])
def test_a_json_array_reads_as_its_jsonl(tmp_path, dump):
    rows = _rows()
    expected = _read(write_jsonl(tmp_path / "c.jsonl", rows))
    assert len(expected[0]) == 5 and expected[1] == {"no_assistant_turn": 1, "duplicate_id": 1}
    array = tmp_path / "c.json"
    array.write_text(dump(rows), encoding="utf-8")
    assert _read(array) == expected


def test_an_arrays_errors_name_its_items(tmp_path):
    array = tmp_path / "c.json"
    rows = make_conversations(3)
    rows[1] = {"conversations": [{"role": "robot", "content": "x"}]}
    array.write_text(json.dumps(rows, indent=2))
    with pytest.raises(LabError, match=r"item 2: unknown role 'robot'"):
        read_conversations(array)
    array.write_text(json.dumps([rows[0], ["not", "an", "object"]]))
    with pytest.raises(LabError, match=r"item 2: expected a JSON object, got list"):
        read_conversations(array)
    array.write_text(json.dumps(make_conversations(2)) + "\n" + json.dumps(make_conversations(1)))
    with pytest.raises(LabError, match=r"begins with \[ but is not one valid JSON array of conversations \(Extra data"):
        read_conversations(array)


@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_a_gzip_file_reads_as_the_file_it_holds(tmp_path, suffix):
    rows = _rows()
    plain = tmp_path / f"c.{suffix}"
    plain.write_text(json.dumps(rows) if suffix == "json" else "".join(json.dumps(r) + "\n" for r in rows))
    packed = tmp_path / f"c.{suffix}.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert _read(packed) == _read(plain)
    packed.write_bytes(packed.read_bytes()[:-12])  # cut short
    with pytest.raises(LabError, match=r"gzip-compressed, but cannot be decompressed"):
        read_conversations(packed)


def test_a_file_given_for_a_directory_is_named_so(random_llama, tmp_path):
    weights = next(random_llama.glob("*.safetensors"))
    for load in (load_target, load_tokenizer):
        with pytest.raises(LabError, match="is a file, not a model directory"):
            load(weights)
    with pytest.raises(LabError, match="is a file, not a drafter directory: give the directory that holds it"):
        read_checkpoint(weights)
    with pytest.raises(LabError, match="model directory not found"):
        load_target(tmp_path / "nope")


def test_a_plain_capture_rerun_regenerating_says_only_why(random_llama, tmp_path, capsys):
    """A capture that did not regenerate never records stop tokens: no "begun before" line for them."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    out = tmp_path / "feat"
    args = ("data", "prepare", "--target", random_llama, "--conversations", convs, "--out", out,
            "--max-length", "128", "--shard-size", "2", "--val-fraction", "0")
    assert run_cli(*args) == 0
    capsys.readouterr()
    assert run_cli(*args, "--regenerate") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {out / 'manifest.json'}: manifest was made with other "
                                               "settings (regenerate: None there"), err
