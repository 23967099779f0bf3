"""Review s75 (h8): SpecForge aux layer ids handed to import_specforge from a config (a Python caller's
`eagle_aux_hidden_state_layer_ids`) are whole numbers by check_aux_layer_ids' rule, refused as typed in
one line; 2.5 was read as layer 2, and "two" or null was a traceback."""

from __future__ import annotations

import json

import pytest
import torch

from drafter_lab.data.specforge import import_specforge
from drafter_lab.errors import LabError


def _sf_dir(root, n=2):
    root.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for k in range(n):
        torch.save({"input_ids": torch.arange(1, 5), "loss_mask": torch.ones(4, dtype=torch.long),
                    "hidden_state": torch.randn(1, 4, 8, generator=g),
                    "aux_hidden_state": torch.randn(1, 4, 24, generator=g)}, root / f"s{k}.ckpt")
    return root


@pytest.mark.parametrize("typed", [[0.5, 1, 2], [0, 1, 2.5], ["zero", 1, 2], [None, 1, 2], [True, 1, 2], "012"])
def test_ids_that_are_no_whole_numbers_are_one_line_naming_the_target(tiny_target, tmp_path, typed):
    with pytest.raises(LabError) as e:
        import_specforge(_sf_dir(tmp_path / "sf"), tiny_target, tmp_path / "out", aux_layer_ids=typed)
    assert str(e.value) == (f"{tiny_target}: aux layer ids must be whole numbers (SpecForge's: the output of "
                            f"layer i), got {typed!r}")
    assert not (tmp_path / "out").exists()


def test_ids_read_from_a_specforge_config_import_as_whole_numbers(tiny_target, tmp_path):
    """JSON's 0.0 and a numeric string are whole numbers, as check_aux_layer_ids takes them."""
    config = tmp_path / "draft_config.json"
    config.write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [0.0, "1", 2]}))
    typed = json.loads(config.read_text())["eagle_aux_hidden_state_layer_ids"]
    manifest = import_specforge(_sf_dir(tmp_path / "sf"), tiny_target, tmp_path / "out", aux_layer_ids=typed)
    assert manifest.aux_layer_ids == [1, 2, 3]
    assert all(type(i) is int for i in manifest.aux_layer_ids)
