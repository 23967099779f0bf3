"""Review of targets/hf.py and fingerprint.py on real directories: a model re-saved unsharded over a
sharded save, a multimodal wrapper AutoModelForCausalLM loads as its text model (Llama 4), sharded
pickles with an index, a generation config listing several eos ids, and an HF cache snapshot whose
files are links into blobs/."""

from __future__ import annotations

import json
import os
import shutil

import torch

from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint
from drafter_lab.targets.hf import load_target, load_target_head, stop_token_ids

TEXT = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2)


def _llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TEXT))


def test_a_model_resaved_unsharded_over_a_sharded_save_reads_its_own_file(tmp_path):
    """save_pretrained removes the old shards but leaves their index; transformers loads model.safetensors."""
    path = tmp_path / "m"
    _llama(0).save_pretrained(path, max_shard_size="20KB")
    new = _llama(1)
    new.save_pretrained(path)
    assert (path / "model.safetensors.index.json").exists() and (path / "model.safetensors").exists()
    head = load_target_head(path)
    assert torch.equal(head.lm_head_weight(), new.lm_head.weight)
    assert torch.equal(head.embed_weight(), load_target(path, tokenizer=False).embed_weight())


def test_llama4_is_named_by_its_wrapper_loaded_whole_or_by_its_head(tmp_path):
    """AutoModelForCausalLM loads Llama 4's image-text checkpoint as Llama4ForCausalLM, whose config names
    no architecture: the target is still the wrapper vLLM serves, as its head says."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    torch.manual_seed(0)
    cfg = Llama4Config(text_config=dict(TEXT, head_dim=8, intermediate_size_mlp=64, num_local_experts=2),
                       vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, image_size=28, patch_size=14,
                                          projector_input_dim=32, projector_output_dim=32, vision_output_dim=32))
    path = tmp_path / "llama4"
    Llama4ForConditionalGeneration(cfg).save_pretrained(path)
    full, head = load_target(path, tokenizer=False), load_target_head(path)
    assert full.architecture == "Llama4ForConditionalGeneration"
    assert full.describe() == head.describe()


def test_sharded_pickles_with_an_index(tmp_path):
    model = _llama()
    path = tmp_path / "bin"
    model.config.save_pretrained(path)
    sd = model.state_dict()
    names = list(sd)
    shards = {f"pytorch_model-0000{i + 1}-of-00002.bin": names[i::2] for i in range(2)}
    for f, part in shards.items():
        torch.save({k: sd[k] for k in part}, path / f)
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, part in shards.items() for k in part}}))
    head = load_target_head(path)
    assert torch.equal(head.lm_head_weight(), sd["lm_head.weight"])
    assert torch.equal(head.embed_weight(), sd["model.embed_tokens.weight"])


def test_every_eos_a_generation_config_lists_stops(random_llama, tmp_path):
    path = tmp_path / "m"
    shutil.copytree(random_llama, path)
    gen = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [5, 7]}))
    target = load_target(path)
    assert stop_token_ids(target) == [target.tokenizer.eos_token_id, 5, 7]


def test_an_hf_cache_snapshot_is_named_by_its_blobs_wherever_it_lies(random_llama, tmp_path):
    """snapshots/<rev>/ holds links into blobs/ named by hash: the name follows the links, and neither
    the directory's place nor the files' times are part of it."""
    repo = tmp_path / "models--org--m"
    snapshot = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(os.listdir(random_llama))):
        shutil.copy(random_llama / f, repo / "blobs" / f"{i:040x}")
        (snapshot / f).symlink_to(f"../../blobs/{i:040x}")
    assert fingerprint(snapshot) == fingerprint(random_llama)
    assert legacy_fingerprint(snapshot) == legacy_fingerprint(random_llama)
    (tmp_path / "link").symlink_to(snapshot)
    moved = shutil.copytree(random_llama, tmp_path / "moved")
    os.utime(moved / "model.safetensors", (0, 0))
    assert fingerprint(tmp_path / "link") == fingerprint(moved) == fingerprint(random_llama)
    assert load_target_head(snapshot).describe()["fingerprint"] == fingerprint(random_llama)
