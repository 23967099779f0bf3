"""fingerprint: a target's name from config.json and its weight files' sizes, heads and tails."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import fingerprint

MiB = 1 << 20


def _blob(size, salt):
    return (bytes([salt]) + bytes(range(251)) * (size // 251 + 1))[:size]


def _model(path, sizes):
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "llama"}')
    for i, size in enumerate(sizes):
        (path / f"model-{i + 1:05d}-of-{len(sizes):05d}.safetensors").write_bytes(_blob(size, 7 + 2 * i))
    return path


def test_recorded_fingerprints_keep_their_value(tmp_path):
    # Feature sets, paired drafters and journals name their target by it: a formula change orphans them.
    assert fingerprint(_model(tmp_path / "m", [3 * MiB, 1000])) == "3b343d2a9f11fd78"


@pytest.mark.parametrize("size, offset", [(1000, 999), (MiB + 4096, MiB + 100), (2 * MiB, 2 * MiB - 1),
                                          (3 * MiB, 3 * MiB - 5), (3 * MiB, 10)])
def test_a_changed_byte_in_the_hashed_spans_changes_it(tmp_path, size, offset):
    model = _model(tmp_path / "m", [size])
    before = fingerprint(model)
    weights = next(model.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[offset] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert fingerprint(model) != before


def test_config_and_file_names_are_part_of_it(tmp_path):
    model = _model(tmp_path / "m", [1000])
    before = fingerprint(model)
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    assert fingerprint(model) != before
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model-00001-of-00001.safetensors").rename(model / "model.safetensors")
    assert fingerprint(model) != before


def test_a_directory_without_config_is_one_line(tmp_path):
    with pytest.raises(LabError, match="config.json is missing"):
        fingerprint(tmp_path)
