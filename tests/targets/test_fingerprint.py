"""fingerprint: the same model keeps its name whichever transformers release saved it; any change to
its settings or weights gives a new one; a bad config.json is one line naming it."""

from __future__ import annotations

import json
import shutil

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import fingerprint


def _copy(random_llama, dest):
    shutil.copytree(random_llama, dest)
    return dest, json.loads((dest / "config.json").read_text())


def _write(path, config: dict):
    (path / "config.json").write_text(json.dumps(config, indent=2))


def test_another_transformers_release_keeps_the_fingerprint(random_llama, tmp_path):
    path, config = _copy(random_llama, tmp_path / "m")
    before = fingerprint(path)
    # What a newer release writes on save_pretrained: its own version, keys in another order.
    _write(path, {**dict(reversed(config.items())), "transformers_version": "99.0.0"})
    assert fingerprint(path) == before
    _write(path, {k: v for k, v in config.items() if k != "transformers_version"})
    assert fingerprint(path) == before


def test_a_setting_or_the_weights_change_it(random_llama, tmp_path):
    path, config = _copy(random_llama, tmp_path / "m")
    before = fingerprint(path)
    _write(path, {**config, "rms_norm_eps": config["rms_norm_eps"] * 10})
    assert fingerprint(path) != before
    _write(path, config)
    assert fingerprint(path) == before
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert fingerprint(path) != before


@pytest.mark.parametrize("text, problem", [
    ("{not json", "config.json is not valid JSON"),
    ("[1, 2]", "config.json is not a JSON object"),
])
def test_a_bad_config_is_one_line(random_llama, tmp_path, text, problem):
    path, _ = _copy(random_llama, tmp_path / "m")
    (path / "config.json").write_text(text)
    with pytest.raises(LabError, match=problem):
        fingerprint(path)
    (path / "config.json").unlink()
    with pytest.raises(LabError, match="config.json is missing"):
        fingerprint(path)
