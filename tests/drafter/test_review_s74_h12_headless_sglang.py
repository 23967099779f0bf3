"""Mutation audit (review s74, h12) of drafter/checkpoint.py read_checkpoint: a whole-vocabulary SGLang drafter
without lm_head whose config sets draft_vocab_size. SGLang's LlamaForCausalLMEagle3 loads its target's head only
when the field is null; given one, it serves the head it allocated, never set. Reading such a drafter said
nothing of it."""

from __future__ import annotations

import json

import torch

from drafter_lab.drafter import checkpoint, formats
from drafter_lab.drafter.checkpoint import read_checkpoint, save_drafter

from .test_model import random_drafter, small_config

WANT = ("draft_vocab_size is set and the file has no lm_head, so SGLang would serve this drafter with an "
        "uninitialised lm_head, not its target's (vLLM and the lab use the target's); `export --format sglang` "
        "writes it null")


def _headless(tmp_path, name, fmt=formats.SGLANG, **config):
    """A whole-vocabulary drafter saved without its head, config.json then edited."""
    d = random_drafter(small_config(draft_vocab_size=101), seed=3, dtype=torch.float32)
    path = save_drafter(d, tmp_path / name, fmt, head=False)
    cfg_file = path / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), **config}))
    return path


def test_a_headless_sglang_drafter_with_draft_vocab_size_set_is_noted(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(checkpoint, "log", lines.append)
    path = _headless(tmp_path, "sized", draft_vocab_size=101)
    assert not read_checkpoint(path).has_head
    assert lines == [f"{path / 'config.json'}: {WANT}"]


def test_a_headless_sglang_drafter_with_draft_vocab_size_null_reads_quietly(tmp_path, monkeypatch):
    """As save_drafter writes it: SGLang then loads its target's head, as the lab and vLLM do."""
    lines = []
    monkeypatch.setattr(checkpoint, "log", lines.append)
    path = _headless(tmp_path, "null")
    assert json.loads((path / "config.json").read_text())["draft_vocab_size"] is None
    assert not read_checkpoint(path).has_head
    assert lines == []


def test_a_headless_speculators_drafter_with_draft_vocab_size_set_reads_quietly(tmp_path, monkeypatch):
    """Only vLLM serves the speculators layout, with the target's head."""
    lines = []
    monkeypatch.setattr(checkpoint, "log", lines.append)
    path = _headless(tmp_path, "speculators", formats.SPECULATORS)
    assert json.loads((path / "config.json").read_text())["draft_vocab_size"] == 101
    assert not read_checkpoint(path).has_head
    assert lines == []
