"""Review s71: export read a run record's target.path that is no string as no target known (the source's
dtype written, silently), where a transfer refuses it naming run.json."""

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


def _record(drafter_dir, path):
    (drafter_dir / "run.json").write_text(json.dumps({"config": {}, "target": {"path": path}}))


@pytest.mark.parametrize("path", [123, ["t"], {"p": "t"}])
def test_a_recorded_target_path_that_is_no_string_is_one_line(drafter_dir, tmp_path, capsys, path):
    _record(drafter_dir, path)
    assert main(["export", "--drafter", str(drafter_dir), "--format", "sglang", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {drafter_dir / 'run.json'}: run record's target.path is {path!r}, not a string\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("path", [None, "", "/no/such/target"])
def test_a_recorded_target_path_null_empty_or_gone_exports_in_the_sources_dtype(drafter_dir, tmp_path, path):
    _record(drafter_dir, path)
    assert main(["export", "--drafter", str(drafter_dir), "--format", "sglang", "--out", str(tmp_path / "o")]) == 0
    assert json.loads((tmp_path / "o" / "config.json").read_text())["torch_dtype"] == "float32"
