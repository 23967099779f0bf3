"""load_target_head: a target's embedding and lm_head read from its files, equal to the loaded model's,
for one file, shards with an index, a tied head, a multimodal-style prefix and .bin-only checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, load_target_head


def _llama(out, tie=False, **save_kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(len(str(out)))
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    LlamaForCausalLM(cfg).save_pretrained(out, **save_kw)
    return out


def _same_as_loaded(path):
    full, head = load_target(path, tokenizer=False), load_target_head(path)
    assert torch.equal(full.embed_weight(), head.embed_weight())
    assert torch.equal(full.lm_head_weight(), head.lm_head_weight())
    assert full.describe() == head.describe()
    return head


def test_head_equals_the_loaded_models(tmp_path):
    one = _same_as_loaded(_llama(tmp_path / "one"))
    assert not torch.equal(one.embed_weight(), one.lm_head_weight())
    sharded = _llama(tmp_path / "sharded", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists()
    _same_as_loaded(sharded)
    tied = _same_as_loaded(_llama(tmp_path / "tied", tie=True))
    assert tied.lm_head_weight() is tied.embed_weight()
    _same_as_loaded(_llama(tmp_path / "bin", safe_serialization=False))


def test_names_are_found_under_a_wrapper_prefix(tmp_path):
    path = _llama(tmp_path / "wrapped")
    tensors = load_file(path / "model.safetensors")
    save_file({f"language_model.{k}": v for k, v in tensors.items()}, path / "model.safetensors")
    head = load_target_head(path)
    assert torch.equal(head.lm_head_weight(), tensors["lm_head.weight"].float())
    assert torch.equal(head.embed_weight(), tensors["model.embed_tokens.weight"].float())


def test_a_head_that_cannot_be_found_is_one_line_naming_the_dir(tmp_path):
    path = _llama(tmp_path / "headless")
    tensors = load_file(path / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(LabError, match="no lm_head.weight tensor") as e:
        load_target_head(path)
    assert str(path) in str(e.value)
    path = _llama(tmp_path / "mismatched")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "hidden_size": 48}))
    with pytest.raises(LabError, match="do not match hidden_size 48"):
        load_target_head(path)
    with pytest.raises(LabError, match="model directory not found"):
        load_target_head(tmp_path / "nothing")


def test_a_bad_weights_file_is_one_line_naming_it(tmp_path):
    path = _llama(tmp_path / "truncated")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(LabError, match="cannot read safetensors file") as e:
        load_target_head(path)
    assert str(weights) in str(e.value) and len(str(e.value).splitlines()) == 1
    path = _llama(tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard = path / index["weight_map"]["lm_head.weight"]
    shard.unlink()
    with pytest.raises(LabError, match="cannot read safetensors file") as e:
        load_target_head(path)
    assert str(shard) in str(e.value)
    (path / "model.safetensors.index.json").write_text("[]")  # valid JSON, no index
    with pytest.raises(LabError, match="not a shard index"):
        load_target_head(path)
