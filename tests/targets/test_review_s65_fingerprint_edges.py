"""fingerprint's edges no other test reached: a tensor of exactly WHOLE bytes is hashed whole, a tensor's
windows are capped, a header that is no length or tensors outside the file are refused by name, hidden
files and a malformed .bin index are skipped, a file given for its directory is named as such, and the
legacy name of a weight file between 1 and 2 MiB (which older labs recorded) keeps its value."""

from __future__ import annotations

import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets import fingerprint as fp
from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint, weight_files

MiB = 1 << 20


def _blob(size, salt):
    return (bytes([salt]) + bytes(range(251)) * (size // 251 + 1))[:size]


def _safetensors(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def _dir(tmp_path, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    return d


def test_a_tensor_of_exactly_whole_bytes_is_hashed_whole(tmp_path):
    # A byte between the windows of a larger tensor still moves the name of one of WHOLE bytes (64 KiB:
    # a norm's weight of 16k floats), else a fine-tune of it goes unseen.
    n = fp.WHOLE
    header = {"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}
    data = bytearray(_blob(n, 3))
    d = _dir(tmp_path)
    (d / "model.safetensors").write_bytes(_safetensors(header, bytes(data)))
    before = fingerprint(d)
    data[2 * fp.WINDOW] ^= 0xFF  # past the first window, before the middle one
    (d / "model.safetensors").write_bytes(_safetensors(header, bytes(data)))
    assert fingerprint(d) != before


def test_windows_per_tensor_are_capped():
    # A 1 TB checkpoint stays at a few thousand reads: at most `most` windows besides the first and last.
    spans = list(fp._windows(100, 1000 * fp.WHOLE, 1, 4))
    assert len(spans) == 6
    assert spans[0] == (100, fp.WINDOW) and spans[-1] == (100 + 1000 * fp.WHOLE - fp.WINDOW, fp.WINDOW)
    assert all(100 <= at and at + size <= 100 + 1000 * fp.WHOLE for at, size in spans)


@pytest.mark.parametrize("content, says", [
    # a git-lfs pointer left where the weights should be: its first 8 bytes read as a length of exabytes
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n", "bad header length"),
    (_safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8), "lies outside the file"),
    (_safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, b"\0" * 16), "lies outside the file"),
])
def test_a_file_that_is_no_safetensors_or_is_truncated_is_named(tmp_path, content, says):
    d = _dir(tmp_path)
    (d / "model.safetensors").write_bytes(content)
    with pytest.raises(LabError, match=says) as e:
        fingerprint(d)
    assert "model.safetensors" in str(e.value)


def test_hidden_files_are_no_weights(tmp_path):
    # Half-written downloads and editors' swap files sit beside the weights under a leading dot.
    d = _dir(tmp_path)
    (d / "model.safetensors").write_bytes(_safetensors({"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}},
                                                       b"\1" * 8))
    before = fingerprint(d)
    (d / ".model.safetensors").write_bytes(b"partial")
    (d / ".pytorch_model.bin").write_bytes(b"partial")
    assert [f.name for f in weight_files(d)] == ["model.safetensors"]
    assert fingerprint(d) == before


@pytest.mark.parametrize("index", [{"weight_map": {"a": ["x.bin"], "b": "other.bin"}}, [1], {"metadata": {}}])
def test_a_malformed_bin_index_names_no_file(tmp_path, index):
    # Loading says what is wrong with it; naming the directory must not stop at a TypeError first.
    d = _dir(tmp_path)
    (d / "pytorch_model.bin").write_bytes(b"\0" * 100)
    (d / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    (d / "other.bin").write_bytes(b"\1" * 10)
    named = ["other.bin"] if "weight_map" in index else []
    assert [f.name for f in weight_files(d)] == sorted([*named, "pytorch_model.bin"])


def test_a_file_given_for_its_directory_is_named_so(tmp_path):
    d = _dir(tmp_path)
    with pytest.raises(LabError, match="is a file, not a model directory"):
        fingerprint(d / "config.json")


def test_an_unreadable_config_is_named(tmp_path):
    d = tmp_path / "m"
    (d / "config.json").mkdir(parents=True)
    with pytest.raises(LabError, match="cannot read config.json"):
        fingerprint(d)


def test_legacy_name_of_a_file_between_one_and_two_mib_keeps_its_value(tmp_path):
    # Such a file's rest after its first MiB is read once: the value older labs wrote down for it.
    d = _dir(tmp_path)
    data = bytearray(_blob(3 * MiB // 2, 5))
    (d / "model.safetensors").write_bytes(bytes(data))
    assert legacy_fingerprint(d) == "ebbb46648a9a14ea"
    data[MiB + 10] ^= 0xFF  # in the tail only
    (d / "model.safetensors").write_bytes(bytes(data))
    assert legacy_fingerprint(d) != "ebbb46648a9a14ea"
