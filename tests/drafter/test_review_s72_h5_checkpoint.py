"""Session 72 audit of drafter/checkpoint.py: config.json read once (not again in the locale's encoding),
a blank recorded target architecture, and read_vocab filling in what a file leaves out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import drafter_lab
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import export, read_checkpoint, read_vocab, save_drafter
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config


def _drafter(tmp_path, draft_vocab: int = 101) -> Path:
    """A small drafter saved in the SGLang layout, drafting over `draft_vocab` of the target's 101 ids."""
    return save_drafter(random_drafter(small_config(draft_vocab_size=draft_vocab), seed=3, dtype=torch.float32),
                        tmp_path / "d")


def _edit(path: Path, **fields) -> None:
    data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    (path / "config.json").write_text(json.dumps({**data, **fields}, ensure_ascii=False), encoding="utf-8")


def _in_ascii_locale(code: str, *args) -> subprocess.CompletedProcess:
    """`code` run by a Python whose locale encoding is ASCII (as under LANG=C without UTF-8 mode), importing
    the drafter_lab this test runs."""
    env = {**os.environ, "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "LC_ALL": "C", "LANG": "C"}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=Path(drafter_lab.__file__).parents[1], timeout=120)


def test_a_utf8_config_is_read_whatever_the_locale(tmp_path):
    """config.json was read again, in the locale's encoding, for its quantization_config and draft_vocab_size:
    a path with an accent in it was a UnicodeDecodeError traceback under LANG=C, after the config had read."""
    path = _drafter(tmp_path)
    _edit(path, _name_or_path="/home/zoë/drafter")
    r = _in_ascii_locale("import sys; from drafter_lab.drafter.checkpoint import read_checkpoint\n"
                         "print(read_checkpoint(sys.argv[1]).config.draft_vocab_size)", path)
    assert (r.returncode, r.stdout.strip()) == (0, "101"), r.stderr[-2000:]


def test_a_utf8_config_without_draft_vocab_size_is_hinted_whatever_the_locale(tmp_path):
    """The same second read told a head of another size from a config that gives none."""
    path = _drafter(tmp_path, draft_vocab=64)
    data = json.loads((path / "config.json").read_text())
    del data["draft_vocab_size"]
    (path / "config.json").write_text(json.dumps({**data, "_name_or_path": "/home/zoë/drafter"}, ensure_ascii=False),
                                      encoding="utf-8")
    r = _in_ascii_locale("import sys; from drafter_lab.drafter.checkpoint import read_checkpoint\n"
                         "from drafter_lab.errors import LabError\n"
                         "try: read_checkpoint(sys.argv[1])\n"
                         "except LabError as e: print(e)", path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == (f"{path / 'model.safetensors'}: tensor 'lm_head.weight' has 64 rows, the config's "
                                "draft_vocab_size is 101 (config.json gives none, which reads as its vocab_size: set "
                                "draft_vocab_size 64 there)")


@pytest.mark.parametrize("architecture", ["", "  "])
def test_a_blank_recorded_architecture_is_refused_where_it_is_carried(tmp_path, architecture):
    """"" was dropped unsaid (and "  " carried into vLLM's verifier architectures, where no class has that name)."""
    path = _drafter(tmp_path)
    (path / "run.json").write_text(json.dumps({"config": {}, "target": {"architecture": architecture}}))
    with pytest.raises(LabError) as e:
        export(path, formats.SPECULATORS, tmp_path / "out", verifier="org/target")
    assert str(e.value) == f"{path / 'run.json'}: run record's target.architecture is {architecture!r}, not a class name"
    assert not (tmp_path / "out").exists()
    # without --verifier it is not carried, so not refused
    export(path, formats.SPECULATORS, tmp_path / "plain")
    assert load_file(str(tmp_path / "plain/model.safetensors")).keys()


@pytest.mark.parametrize("left_out", [("t2d",), ("d2t", "t2d")])
def test_read_vocab_fills_in_what_the_file_left_out_as_read_checkpoint_does(tmp_path, left_out):
    """SGLang and vLLM read a file without t2d (and a whole-vocabulary one without d2t): read_vocab, reading those
    two alone, fills them in as a whole read does (d2t as the identity, t2d from d2t)."""
    path = _drafter(tmp_path)
    state = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k not in left_out}, str(path / "model.safetensors"))
    vocab, ckpt = read_vocab(path), read_checkpoint(path)
    assert ckpt.filled == left_out
    assert torch.equal(vocab.d2t, ckpt.tensors["d2t"]) and torch.equal(vocab.t2d, ckpt.tensors["t2d"])
    assert torch.equal(vocab.d2t, torch.zeros(101, dtype=torch.int64) if "d2t" in left_out else state["d2t"])
    assert bool(vocab.t2d.all())


def test_an_export_cast_to_a_dtype_keeps_the_token_maps_integer_and_bool(tmp_path):
    """Only float weights take `dtype`: a d2t cast to bf16 rounds its offsets (vocabularies past 256 ids)."""
    path = _drafter(tmp_path, draft_vocab=64)
    export(path, formats.SGLANG, tmp_path / "out", dtype=torch.bfloat16)
    out, src = load_file(str(tmp_path / "out/model.safetensors")), load_file(str(path / "model.safetensors"))
    assert (out["d2t"].dtype, out["t2d"].dtype, out["fc.weight"].dtype) == (torch.int64, torch.bool, torch.bfloat16)
    assert torch.equal(out["d2t"], src["d2t"]) and torch.equal(out["t2d"], src["t2d"])
