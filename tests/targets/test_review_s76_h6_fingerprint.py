"""Mutation audit (review s76, h6): the sampling constants are part of every recorded name. Pinned here on
the sizes where each one decides (a tensor just over WHOLE, one of 3 strides, one past the window cap, a
pickle past FILE_WINDOWS MiB); the large files are sparse, so they cost no disk and few reads. Also: a
header length of 0 or past the file's end, a tensor's begin that is no integer, an empty tensor, a str path."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from drafter_lab.errors import LabError
from drafter_lab.targets.fingerprint import fingerprint

KiB, MiB = 1 << 10, 1 << 20


def _blob(size, salt):
    return (bytes([salt]) + bytes(range(251)) * (size // 251 + 1))[:size]


def _dir(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    return d


def test_names_at_the_sampling_edges_keep_their_value(tmp_path):
    d = _dir(tmp_path, "st")
    sizes = {"whole": 64 * KiB, "just_over": 64 * KiB + 1, "three_strides": 48 * MiB + 3 * KiB,
             "capped": 65 * 16 * MiB + 5}
    header, offset = {}, 0
    for name, n in sizes.items():
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with open(d / "model.safetensors", "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw)
        start = fh.tell()
        for k, (name, n) in enumerate(sizes.items()):  # each tensor's ends written, the rest left sparse
            at = start + header[name]["data_offsets"][0]
            for pos in (at, at + n // 3, at + n // 2, at + n - 300):
                fh.seek(pos)
                fh.write(_blob(300, k))
        fh.truncate(start + offset)
    assert fingerprint(d) == "52b402183c87811a"

    b = _dir(tmp_path, "bin")
    with open(b / "pytorch_model.bin", "wb") as fh:
        for k in range(4100):  # a byte per MiB that tells the windows' places apart
            fh.seek(k * MiB + MiB // 2)
            fh.write(bytes([k % 251 + 1]))
        fh.truncate(4100 * MiB + 7)
    assert fingerprint(b) == "55db98e1ab733b80"


@pytest.mark.parametrize("data", [bytes(8) + b"{}",  # a length of 0: no header at all
                                  (3).to_bytes(8, "little") + b"{}"])  # a header the file ends inside
def test_a_header_length_the_file_cannot_hold_is_named(tmp_path, data):
    d = _dir(tmp_path, "m")
    (d / "model.safetensors").write_bytes(data)
    with pytest.raises(LabError, match="not a safetensors file: bad header length") as e:
        fingerprint(d)
    assert str(d / "model.safetensors") in str(e.value)


@pytest.mark.parametrize("offsets", [["0", 4], [0.0, 4], [True, 4]])
def test_a_tensor_beginning_at_no_integer_is_an_unreadable_header(tmp_path, offsets):
    # the end's type alone checked, the begin would fail as a TypeError in the bounds check or in a seek
    raw = json.dumps({"w": {"dtype": "U8", "shape": [4], "data_offsets": offsets}}).encode()
    d = _dir(tmp_path, "m")
    (d / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(4))
    with pytest.raises(LabError, match="not a safetensors file: unreadable header"):
        fingerprint(d)


def test_an_empty_tensor_is_no_tensor_outside_the_file_and_a_str_path_names_the_same(tmp_path):
    # safetensors writes a tensor of shape [0] with begin == end; run records pass paths as strings
    d = _dir(tmp_path, "m")
    save_file({"empty": torch.zeros(0), "w": torch.ones(4)}, d / "model.safetensors")
    assert fingerprint(str(d)) == fingerprint(d)


def test_a_header_length_past_safetensors_own_limit_is_refused_unread(tmp_path):
    """A file whose first 8 bytes read as a 150 MB length was read into memory whole (sparse: no disk used)."""
    d = _dir(tmp_path, "m")
    with open(d / "model.safetensors", "wb") as fh:
        fh.write((150_000_000).to_bytes(8, "little") + b"{}")
        fh.truncate(200_000_000)
    with pytest.raises(LabError, match="not a safetensors file: bad header length"):
        fingerprint(d)
