"""An exception without a message (a template's `raise_exception('')`, a library's bare error) still
makes a one-line LabError naming the problem, not an IndexError from taking its first line."""

from __future__ import annotations

import pytest
import safetensors
import torch
import transformers

from drafter_lab.data import capture, chat, shards, specforge, vocab
from drafter_lab.errors import LabError


def _bare_error(*args, **kwargs):
    raise RuntimeError()


def test_a_template_raising_without_a_message(random_llama):
    tok = transformers.AutoTokenizer.from_pretrained(random_llama)
    tok.chat_template = "{{ raise_exception('') }}"
    with pytest.raises(LabError, match=r"^chat template rejects the conversation: TemplateError$"):
        chat.render(tok, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(("patch", "read", "message"), [
    ((safetensors, "safe_open"), lambda p, _: shards.stored_text(p), "truncated or corrupt feature shard (RuntimeError)"),
    ((safetensors, "safe_open"), lambda p, _: vocab.DraftVocab.load(p), "truncated or corrupt safetensors (RuntimeError)"),
    ((torch, "load"), lambda p, _: specforge.sample_length(p), "cannot read as a SpecForge sample (RuntimeError)"),
    ((transformers.AutoModelForCausalLM, "from_pretrained"), lambda _, model: capture._load_tp_target(model, torch.float32),
     "cannot load model tensor-parallel: RuntimeError"),
])
def test_a_library_error_without_a_message(random_llama, tmp_path, monkeypatch, patch, read, message):
    monkeypatch.setattr(*patch, _bare_error)
    monkeypatch.setenv("WORLD_SIZE", "1")  # the tensor-parallel load reads it to split the heads
    path = tmp_path / "file"
    path.write_bytes(b"")
    with pytest.raises(LabError) as e:
        read(path, random_llama)
    assert str(e.value).endswith(message)
