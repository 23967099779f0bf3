"""Review of fingerprint.py's choice of weight files and of a head's architecture: training state left
beside a model (accelerate's optimizer.bin, scheduler.bin) is none of its name, ordinary directories keep
the names recorded before, and a config.json naming no architecture gets the class transformers builds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets import fingerprint as fp
from drafter_lab.targets.hf import load_target, load_target_head

TEXT = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def _llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TEXT))


def _head_weight_files(path: Path) -> list[Path]:
    """fingerprint.py's selection before this review, by which names already recorded were taken."""
    files = sorted(f for pat in ("*.safetensors", "*.bin") for f in path.glob(pat))
    return [f for f in files if not (f.name.startswith(".") or f.name == "training_args.bin" or f.is_dir())]


def _names(path) -> tuple[str, str]:
    return fp.fingerprint(path), fp.legacy_fingerprint(path)


def test_training_state_left_beside_the_weights_is_none_of_the_name(tmp_path):
    model = _llama()
    clean = tmp_path / "clean"
    model.save_pretrained(clean)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(clean, ckpt)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    torch.save(opt.state_dict(), ckpt / "optimizer.bin")  # accelerate's save_state
    torch.save({"last_epoch": 1}, ckpt / "scheduler.bin")
    torch.save({"epoch": 0}, ckpt / "sampler.bin")
    torch.save({"lr": 1e-4}, ckpt / "training_args.bin")
    assert _names(ckpt) == _names(clean)
    assert [f.name for f in fp.weight_files(ckpt)] == ["model.safetensors"]

    state_only = tmp_path / "state-only"  # config.json and an optimizer: nothing transformers could load
    state_only.mkdir()
    shutil.copy(clean / "config.json", state_only)
    shutil.copy(ckpt / "optimizer.bin", state_only)
    with pytest.raises(LabError, match="no weight files"):
        load_target_head(state_only)


def _safetensors(path):
    _llama().save_pretrained(path)


def _safetensors_shards(path):
    _llama().save_pretrained(path, max_shard_size="20KB")


def _pickle(path):
    model = _llama()
    model.config.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")


def _pickle_shards(path, prefix="pytorch_model-"):
    model = _llama()
    model.config.save_pretrained(path)
    sd = model.state_dict()
    shards = {f"{prefix}0000{i + 1}-of-00002.bin": list(sd)[i::2] for i in range(2)}
    for f, part in shards.items():
        torch.save({k: sd[k] for k in part}, path / f)
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, part in shards.items() for k in part}}))


def _both_formats(path):
    """A whole hub snapshot of a repo that ships both: every file stays part of the name, as before."""
    _safetensors(path)
    torch.save(_llama().state_dict(), path / "pytorch_model.bin")


@pytest.mark.parametrize("make", [_safetensors, _safetensors_shards, _pickle, _pickle_shards, _both_formats,
                                  lambda p: _pickle_shards(p, prefix="weights-")])
def test_ordinary_directories_keep_the_names_recorded_before(tmp_path, make, monkeypatch):
    path = tmp_path / "m"
    path.mkdir()
    make(path)
    now = _names(path)
    monkeypatch.setattr(fp, "weight_files", _head_weight_files)
    assert now == _names(path)


def test_a_config_naming_no_architecture_is_named_by_the_class_transformers_builds(tmp_path):
    path = tmp_path / "m"
    _llama().save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    del config["architectures"]  # a hand-written config, or an older tool's
    (path / "config.json").write_text(json.dumps(config))
    head, full = load_target_head(path), load_target(path, tokenizer=False)
    assert head.architecture == full.architecture == "LlamaForCausalLM"
    assert head.describe() == full.describe()  # what run.json records, and a speculators export names
