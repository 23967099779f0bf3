"""Fixtures shared by the drafter tests."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.drafter.checkpoint import save_drafter

from .test_model import random_drafter, small_config


@pytest.fixture
def saved(tmp_path):
    """A drafter saved by the lab (SGLang layout, one model.safetensors): (directory, its state)."""
    drafter = random_drafter(small_config(), seed=5, dtype=torch.float32)
    path = save_drafter(drafter, tmp_path / "d")
    return path, load_file(str(path / "model.safetensors"))
