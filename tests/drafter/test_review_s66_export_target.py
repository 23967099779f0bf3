"""export's --target: read beside --dtype too, and a dtype export cannot write said, not passed over."""

import json

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import save_drafter

from .test_model import random_drafter, small_config


@pytest.fixture
def drafter_dir(tmp_path):
    src = tmp_path / "src"
    save_drafter(random_drafter(small_config(), seed=3, dtype=torch.float32), src, formats.SGLANG)
    return src


def _export(drafter_dir, out, *flags) -> int:
    return main(["export", "--drafter", str(drafter_dir), "--format", "sglang", "--out", str(out), *flags])


def test_a_missing_target_beside_dtype_is_refused_before_the_export(drafter_dir, tmp_path, capsys):
    """--dtype decided, so a --target that names nothing was never looked at."""
    assert _export(drafter_dir, tmp_path / "o", "--dtype", "bfloat16", "--target", str(tmp_path / "tpyo")) == 2
    assert "config.json is missing" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("named", ["float64", "auto"])
def test_a_target_dtype_export_cannot_write_is_said(drafter_dir, tmp_path, capsys, named):
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"torch_dtype": named}))
    assert _export(drafter_dir, tmp_path / "o", "--target", str(target)) == 0
    err = capsys.readouterr().err
    assert f"note: {target}'s config.json names dtype {named}, which export does not write" in err
    assert "'s dtype" not in err.splitlines()[-1]  # the export line claims no target dtype
    # with --dtype the choice is made: no note
    assert _export(drafter_dir, tmp_path / "o2", "--target", str(target), "--dtype", "float16") == 0
    assert "note:" not in capsys.readouterr().err
