"""Second mutation audit of drafter/checkpoint.py (s78 h12): what the other tests of save and export left open."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import export, read_checkpoint, read_vocab, save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError


def _drafter() -> Eagle3Drafter:
    """A draft vocabulary of target ids past 256, which bf16 cannot hold exactly."""
    torch.manual_seed(7)
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=16, draft_vocab_size=16, target_vocab_size=600, target_hidden_size=32,
                        aux_layer_ids=[2, 4, 5])
    d = Eagle3Drafter(cfg)
    used = torch.arange(401, 600, 12)[:16]
    with torch.no_grad():
        d.d2t.copy_(used - torch.arange(16))
        d.t2d.zero_()
        d.t2d[used] = True
    return d


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_a_dtype_cast_leaves_the_vocab_mapping_as_it_is(tmp_path, fmt):
    """`dtype` casts the float weights only: a d2t cast to bf16 would name other target ids (or be refused on
    reading as not an integer tensor)."""
    drafter = _drafter()
    out = save_drafter(drafter, tmp_path / "d", fmt, dtype=torch.bfloat16)
    state = load_file(str(out / "model.safetensors"))
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    assert state["fc.weight"].dtype == torch.bfloat16
    ckpt = read_checkpoint(out)
    assert torch.equal(ckpt.tensors["d2t"], drafter.d2t) and torch.equal(ckpt.tensors["t2d"], drafter.t2d)


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_a_drafter_of_a_smaller_draft_vocab_without_its_head_is_refused(tmp_path, fmt):
    """Only a whole-vocabulary drafter shares its target's lm_head: the target's has a row per target token, not
    one per draft token, so a head-less 16-token drafter would draft through the wrong rows."""
    out = save_drafter(_drafter(), tmp_path / "d", fmt)
    weights = out / "model.safetensors"
    save_file({k: v for k, v in load_file(str(weights)).items() if k != formats.HEAD}, str(weights))
    with pytest.raises(LabError) as e:
        read_checkpoint(out)
    assert str(e.value) == (f"{weights}: checkpoint lacks tensor 'lm_head.weight', yet its draft vocab (16) is smaller "
                            "than the target's (600): only a whole-vocabulary drafter shares its target's head")


def test_an_export_into_a_directory_that_holds_files_is_refused_and_leaves_them(tmp_path):
    src = save_drafter(_drafter(), tmp_path / "d")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(LabError) as e:
        export(src, formats.SPECULATORS, out)
    assert str(e.value) == f"{out}: output directory exists and is not empty: choose a new one"
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("serving", [{"speculative_tokens": 3}, {"verifier": "org/target"}])
def test_an_sglang_export_from_python_refuses_the_speculators_settings(tmp_path, serving):
    """Only the command line refused them: export() wrote an SGLang config without a word of them."""
    src = save_drafter(_drafter(), tmp_path / "d")
    with pytest.raises(LabError, match="^--speculative-tokens and --verifier apply to --format speculators$"):
        export(src, formats.SGLANG, tmp_path / "out", **serving)
    assert not (tmp_path / "out").exists()


def test_read_vocab_fills_in_the_mapping_a_whole_vocabulary_drafter_left_out(tmp_path):
    """As read_checkpoint does (SGLang and vLLM read a missing d2t as the identity)."""
    torch.manual_seed(7)
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=16, draft_vocab_size=64, target_vocab_size=64, target_hidden_size=32,
                        aux_layer_ids=[2, 4, 5])
    out = save_drafter(Eagle3Drafter(cfg), tmp_path / "d")
    weights = out / "model.safetensors"
    save_file({k: v for k, v in load_file(str(weights)).items() if k not in ("d2t", "t2d")}, str(weights))
    vocab = read_vocab(out)
    assert torch.equal(vocab.d2t, torch.zeros(64, dtype=torch.int64))
    assert torch.equal(vocab.t2d, torch.ones(64, dtype=torch.bool))
