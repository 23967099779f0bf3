"""`vocab build --out` naming a drafter's weights file: it holds d2t and t2d, so it read as a vocabulary
and was replaced by the new one, losing every weight of the drafter."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from data_helpers import run_cli
from safetensors import safe_open

from drafter_lab.data.vocab import DraftVocab
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import save_drafter

sys.path.insert(0, str(Path(__file__).parents[1] / "drafter"))
from test_model import random_drafter, small_config  # noqa: E402


def _keys(path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())


def test_build_does_not_overwrite_a_drafters_weights_file(features, tmp_path, capsys):
    drafter = save_drafter(random_drafter(small_config(), seed=3, dtype=torch.float32), tmp_path / "d", formats.SGLANG)
    weights = drafter / "model.safetensors"
    before = weights.read_bytes()
    capsys.readouterr()
    assert run_cli("vocab", "build", "--data", features, "--size", 5, "--out", weights) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {weights}: exists and is not a draft vocabulary (it holds more than d2t and t2d): "
                   "give another --out (it is not overwritten)"]
    assert weights.read_bytes() == before and "fc.weight" in _keys(weights)
    # a vocabulary file is still rebuilt in place
    vocab = tmp_path / "vocab.safetensors"
    DraftVocab.from_used(torch.tensor([0, 1]), 512).save(vocab)
    assert run_cli("vocab", "build", "--data", features, "--size", 5, "--out", vocab) == 0
    assert DraftVocab.load(vocab).size == 5 and _keys(vocab) == {"d2t", "t2d"}
