"""load_target_head: a target's embedding and lm_head read from its files, equal to the loaded model's,
for one file, shards with an index, a tied head, a multimodal-style prefix and .bin-only checkpoints;
a multimodal wrapper loads and captures by its text model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.data.capture import prepare_features
from drafter_lab.data.shards import FeatureSet
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, load_target_head, load_tokenizer, stop_token_ids


def _llama(out, tie=False, as_bin=False, **save_kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(len(str(out)))
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg)
    if as_bin:  # transformers 5 writes safetensors whatever save_pretrained is asked: saved as older tools did
        model.config.save_pretrained(out)
        torch.save(model.state_dict(), out / "pytorch_model.bin")
    else:
        model.save_pretrained(out, **save_kw)
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
    as_bin = _llama(tmp_path / "bin", as_bin=True)
    assert (as_bin / "pytorch_model.bin").is_file() and not list(as_bin.glob("*.safetensors*"))  # only .bin to read
    _same_as_loaded(as_bin)


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
    with pytest.raises(LabError, match=f"names shard {shard.name}, which is missing: a partial download") as e:
        load_target_head(path)
    assert str(path) in str(e.value) and len(str(e.value).splitlines()) == 1
    (path / "model.safetensors.index.json").write_text("[]")  # valid JSON, no index
    with pytest.raises(LabError, match="not a shard index"):
        load_target_head(path)


def test_a_multimodal_wrapper_is_a_target_by_its_text_model(random_llama, tmp_path):
    """AutoModelForCausalLM loads Gemma 3's image-text checkpoint as the wrapper, whose own config has
    no num_hidden_layers or hidden_size: they are its text config's."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    tok = load_tokenizer(random_llama)
    text = dict(vocab_size=len(tok) + 4, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    torch.manual_seed(0)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=len(tok),
                       boi_token_index=len(tok) + 1, eoi_token_index=len(tok) + 2,
                       eos_token_id=[tok.eos_token_id, len(tok) + 3])  # Gemma 3 lists <end_of_turn> here
    path = tmp_path / "gemma3"
    Gemma3ForConditionalGeneration(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    head = _same_as_loaded(path)
    assert (head.architecture, head.num_layers, head.hidden_size) == ("Gemma3ForConditionalGeneration", 5, 32)
    # decoding and loss masks stop where the wrapper's config says, not only where its text model's does
    wrapped = load_target(path)
    wrapped.model.generation_config.eos_token_id = None  # as where no generation_config.json ships
    assert stop_token_ids(wrapped) == [tok.eos_token_id, len(tok) + 3]  # not the text config's default (1)
    convs = tmp_path / "chats.jsonl"
    convs.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer number {i}"}]}) + "\n"
        for i in range(3)))
    manifest = prepare_features(path, convs, tmp_path / "feat", max_length=64, val_fraction=0.0)
    assert manifest.aux_layer_ids == [2, 2, 2] and manifest.target == head.describe()
    assert [s.aux_hidden.shape[1] for s in FeatureSet(tmp_path / "feat").sequences("train")] == [96] * 3


def test_names_are_the_models_own_for_other_families(tmp_path):
    """GPT-2 keeps its (tied) embedding as `transformer.wte`, and hub checkpoints store it without the
    prefix; Pythia (GPT-NeoX) has `gpt_neox.embed_in` and stores its head as `embed_out`."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(gpt2)
    head = _same_as_loaded(gpt2)
    assert head.lm_head_weight() is head.embed_weight()
    tensors = load_file(gpt2 / "model.safetensors")
    save_file({k.removeprefix("transformer."): v for k, v in tensors.items()}, gpt2 / "model.safetensors")
    assert torch.equal(_same_as_loaded(gpt2).embed_weight(), tensors["transformer.wte.weight"])
    pythia = tmp_path / "pythia"
    GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, bos_token_id=0, eos_token_id=0)).save_pretrained(pythia)
    head = _same_as_loaded(pythia)
    assert torch.equal(head.lm_head_weight(), load_file(pythia / "model.safetensors")["embed_out.weight"])
    tensors = load_file(pythia / "model.safetensors")
    del tensors["embed_out.weight"]
    save_file(tensors, pythia / "model.safetensors")
    with pytest.raises(LabError, match="no lm_head.weight tensor"):
        load_target_head(pythia)


def test_a_relative_target_path_is_recorded_whole(random_llama, tmp_path, monkeypatch):
    """A run record names its target by the path it was loaded from: one given relative to where a
    command ran must still name it from elsewhere (train --init-from finds the source's tokenizer there)."""
    import shutil

    from drafter_lab.drafter.transfer import source_tokens

    shutil.copytree(random_llama, tmp_path / "model")
    (tmp_path / "drafter").mkdir()
    monkeypatch.chdir(tmp_path)
    head = load_target_head("model")
    assert head.describe()["path"] == str(tmp_path / "model") == load_target("model").describe()["path"]
    (tmp_path / "drafter" / "run.json").write_text(json.dumps({"target": head.describe()}))
    monkeypatch.chdir(tmp_path / "drafter")  # a later command, run elsewhere
    found = source_tokens(tmp_path / "drafter", None, load_target_head(tmp_path / "model"))[1]
    assert found == f"the target its run.json names, {tmp_path / 'model'}"
