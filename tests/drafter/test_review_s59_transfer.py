"""transfer.source_tokens: the target a source's run.json names is found, not asked for."""

from __future__ import annotations

import json
import shutil

from drafter_lab.drafter import formats
from drafter_lab.drafter.transfer import source_tokens
from drafter_lab.targets.fingerprint import fingerprint
from drafter_lab.targets.hf import load_target_head

from .test_transfer import source


def test_a_named_target_whose_weights_cannot_be_read_is_not_at_hand(random_llama, tmp_path):
    """Its weights now a dangling link (a cache cleaned, a download cut): the transfer goes on by id, as
    for any target not at hand, instead of failing on a directory the user never named."""
    _, path = source(tmp_path, formats.SGLANG)
    old = tmp_path / "old-target"
    shutil.copytree(random_llama, old)
    (path / "run.json").write_text(json.dumps({"target": {"path": str(old), "fingerprint": fingerprint(old)}}))
    target = load_target_head(random_llama)
    assert source_tokens(path, None, target)[1] == f"the target its run.json names, {old}"
    for f in old.glob("*.safetensors"):
        f.unlink()
        f.symlink_to(tmp_path / "gone.safetensors")
    assert source_tokens(path, None, target) == (None, None)
