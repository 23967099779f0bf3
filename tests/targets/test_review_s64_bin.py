"""A truncated or corrupt pytorch_model*.bin is named in the one-line error load_target gives (it named the
directory and said only torch's "failed finding central directory"); broken_file is asked after a failure only,
and never blames a .bin that transformers does not read (safetensors beside it)."""

from __future__ import annotations

import json

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets import hf
from drafter_lab.targets.hf import broken_file, load_target, load_target_head


def _bin_llama(path, shards: int = 1):
    """A tiny Llama stored as pytorch_model*.bin alone (transformers 5 writes safetensors whatever it is
    asked, so the state dict is saved by torch, as older tools wrote it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    model.config.save_pretrained(path)
    sd = model.state_dict()
    if shards == 1:
        torch.save(sd, path / "pytorch_model.bin")
        return path / "pytorch_model.bin"
    names = list(sd)
    files = {f"pytorch_model-0000{i + 1}-of-0000{shards}.bin": names[i::shards] for i in range(shards)}
    for f, part in files.items():
        torch.save({k: sd[k] for k in part}, path / f)
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, part in files.items() for k in part}}))
    return path / list(files)[-1]


def _error(path) -> str:
    with pytest.raises(LabError) as e:
        load_target(path, tokenizer=False)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_truncated_bin_is_named(tmp_path):
    f = _bin_llama(tmp_path / "m")
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert _error(tmp_path / "m") == f"{f}: truncated torch weights file: its zip archive has no end (a partial download?)"
    with pytest.raises(LabError, match=f"^{f}: truncated"):  # a .bin-only head is read by loading the model
        load_target_head(tmp_path / "m")


def test_a_truncated_shard_is_named_not_its_sibling(tmp_path):
    f = _bin_llama(tmp_path / "m", shards=2)
    f.write_bytes(f.read_bytes()[:100])
    assert _error(tmp_path / "m").startswith(f"{f}: truncated torch weights file")


@pytest.mark.parametrize("content, said", [
    (b"", "EOFError"),
    (b"\x80\x02" + b"not a pickle" * 20, "cannot read torch weights file (corrupt?): "),
])
def test_a_corrupt_bin_is_named(tmp_path, content, said):
    f = _bin_llama(tmp_path / "m")
    f.write_bytes(content)
    message = _error(tmp_path / "m")
    assert message.startswith(f"{f}: cannot read torch weights file (corrupt?): ") and said in message
    assert "weights_only" not in message  # torch's advice to load it unsafely is not for a corrupt file


def test_a_good_bin_loads_without_asking_which_file_is_broken(tmp_path, monkeypatch):
    def asked(*args, **kwargs):
        raise AssertionError("broken_file was asked of a load that did not fail")

    monkeypatch.setattr(hf, "broken_file", asked)
    f = _bin_llama(tmp_path / "m")
    assert load_target(f.parent, tokenizer=False).model.config.vocab_size == 300


def test_a_stray_bin_beside_safetensors_is_not_blamed(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path / "m"
    LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(path)
    (path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 cut short")  # transformers reads model.safetensors
    assert broken_file(path, (), weights=True) is None
    (path / "model.safetensors").write_bytes(b"cut short")
    assert str(broken_file(path, (), weights=True)).startswith(f"{path / 'model.safetensors'}: ")
