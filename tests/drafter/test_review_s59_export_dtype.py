"""`export` writes a drafter in its target's dtype: SGLang's `--dtype auto` loads a float32 drafter as
float16, which fails beside a bfloat16 target fed to it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from drafter_lab.cli import main
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import save_drafter

from .test_model import random_drafter, small_config


def _target(path, **fields):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **fields}))
    return path


def _dtypes(out) -> tuple[set, str]:
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        kinds = {f.get_slice(k).get_dtype() for k in f.keys() if k not in ("d2t", "t2d")}  # the vocab maps are ints
    config = json.loads((out / "config.json").read_text())
    return kinds, config.get("torch_dtype", config.get("dtype"))


@pytest.fixture
def trained(tmp_path):
    """A float32 drafter as `train` leaves it, its run.json naming the target it was trained for."""
    src = tmp_path / "run"
    save_drafter(random_drafter(small_config(), seed=3, dtype=torch.float32), src, formats.SGLANG)
    (src / "run.json").write_text(json.dumps({"config": {}, "target": {"path": str(tmp_path / "gone")}}))
    return src


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_the_export_takes_the_targets_dtype(tmp_path, trained, fmt, capsys):
    bf16 = _target(tmp_path / "bf16", torch_dtype="bfloat16")
    assert main(["export", "--drafter", str(trained), "--format", fmt, "--out", str(tmp_path / "a"),
                 "--target", str(bf16)]) == 0
    assert _dtypes(tmp_path / "a") == ({"BF16"}, "bfloat16")
    assert "in bfloat16, " in capsys.readouterr().err
    # the one run.json names, where it still is (transformers 5 writes `dtype`, a wrapper's in text_config)
    run = json.loads((trained / "run.json").read_text())
    run["target"]["path"] = str(_target(tmp_path / "vl", text_config={"dtype": "float16"}))
    (trained / "run.json").write_text(json.dumps(run))
    assert main(["export", "--drafter", str(trained), "--format", fmt, "--out", str(tmp_path / "b")]) == 0
    assert _dtypes(tmp_path / "b") == ({"F16"}, "float16")
    # --dtype still decides
    assert main(["export", "--drafter", str(trained), "--format", fmt, "--out", str(tmp_path / "c"),
                 "--target", str(bf16), "--dtype", "float32"]) == 0
    assert _dtypes(tmp_path / "c") == ({"F32"}, "float32")


def test_without_a_known_target_the_source_dtype_stays(tmp_path, trained):
    assert main(["export", "--drafter", str(trained), "--format", "sglang", "--out", str(tmp_path / "a")]) == 0
    assert _dtypes(tmp_path / "a") == ({"F32"}, "float32")


def test_a_target_without_a_config_is_one_line(tmp_path, trained, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export", "--drafter", str(trained), "--format", "sglang", "--out", str(tmp_path / "a"),
                 "--target", str(tmp_path / "empty")]) == 2
    assert "config.json is missing" in capsys.readouterr().err
