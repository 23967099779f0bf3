"""Review s73 (h4): mutation audit of drafter/checkpoint.py; pins what survived."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import export


def test_an_export_cast_to_a_dtype_keeps_the_drafters_own_embedding(saved, tmp_path):
    """The zeros that stand in for an embedding the source left out must not replace one it holds: with a
    dtype nothing copies the file's tensors back, so the export wrote an all-zero embedding."""
    path, state = saved
    out = export(path, formats.SGLANG, tmp_path / "out", dtype=torch.float16)
    written = load_file(str(out / "model.safetensors"))
    assert written[formats.EMBED].dtype == torch.float16
    assert written[formats.EMBED].any()
    torch.testing.assert_close(written[formats.EMBED], state[formats.EMBED].to(torch.float16))
