"""Targets whose config, model or tokenizer class is their own code (config.json's auto_map, as Kimi K2's):
one line naming --trust-remote-code without it (never transformers' prompt), the head read from the
config's fields alone (no code runs), and with it the model loads whole."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import REMOTE_CODE_ENV, load_target, load_target_head

CONFIG_CODE = """from transformers import LlamaConfig


class CustomConfig(LlamaConfig):
    model_type = "custom_llama"
"""
MODEL_CODE = """from transformers import LlamaForCausalLM

from .configuration_custom import CustomConfig


class CustomForCausalLM(LlamaForCausalLM):
    config_class = CustomConfig
"""


@pytest.fixture
def custom(random_llama, tmp_path, monkeypatch):
    """The random Llama's weights and tokenizer, its config and model classes its own code."""
    monkeypatch.setenv(REMOTE_CODE_ENV, "")  # not allowed; and whatever main() sets is undone after the test
    out = tmp_path / "custom"
    shutil.copytree(random_llama, out)
    (out / "configuration_custom.py").write_text(CONFIG_CODE)
    (out / "modeling_custom.py").write_text(MODEL_CODE)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(model_type="custom_llama", architectures=["CustomForCausalLM"],
               auto_map={"AutoConfig": "configuration_custom.CustomConfig",
                         "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"})
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_without_the_flag_it_is_one_line_naming_it(custom):
    with pytest.raises(LabError) as e:
        load_target(custom)
    assert str(e.value) == (f"{custom}: its model needs the model's own code (config.json's auto_map): pass "
                            f"--trust-remote-code (drafter-lab --trust-remote-code COMMAND ..., or {REMOTE_CODE_ENV}=1) "
                            "to run it")


def test_its_head_is_read_without_running_its_code(custom, random_llama):
    head, plain = load_target_head(custom), load_target_head(random_llama)
    assert (head.architecture, head.num_layers, head.hidden_size, head.vocab_size) == \
        ("CustomForCausalLM", plain.num_layers, plain.hidden_size, plain.vocab_size)
    assert torch.equal(head.embed_weight(), plain.embed_weight())
    assert torch.equal(head.lm_head_weight(), plain.lm_head_weight())


def test_with_the_flag_the_model_is_its_own_class_and_computes_the_same(custom, random_llama, tmp_path):
    from drafter_lab.cli import main

    convs = tmp_path / "chats.jsonl"
    convs.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}) + "\n"
        for i in range(2)))
    args = ["data", "prepare", "--target", str(custom), "--conversations", str(convs), "--out", str(tmp_path / "f"),
            "--val-fraction", "0"]
    assert main(args) == 2  # the one line above
    assert main(["--trust-remote-code", *args]) == 0  # the flag reaches every loader
    target, plain = load_target(custom), load_target(random_llama)
    assert type(target.model).__name__ == "CustomForCausalLM"
    ids = torch.tensor([[1, 5, 9, 33]])
    with torch.no_grad():
        assert torch.equal(target.model(ids).logits, plain.model(ids).logits)


def test_a_wrapper_of_its_own_code_is_read_by_its_text_config(tmp_path, monkeypatch):
    """Kimi K2.5's layout: a multimodal wrapper of its own code, its text model's fields under
    text_config and its matrices under language_model.: the head needs none of its code."""
    from safetensors.torch import save_file

    monkeypatch.setenv(REMOTE_CODE_ENV, "")
    out = tmp_path / "k25"
    out.mkdir()
    text = {"model_type": "kimi_k2", "hidden_size": 32, "num_hidden_layers": 5, "vocab_size": 100,
            "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text,
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                     "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"}}))
    g = torch.Generator().manual_seed(0)
    embed, head = torch.randn(100, 32, generator=g), torch.randn(100, 32, generator=g)
    save_file({"language_model.model.embed_tokens.weight": embed, "language_model.lm_head.weight": head,
               "language_model.model.norm.weight": torch.ones(32),
               "vision_tower.patch_embed.weight": torch.randn(32, 3, generator=g)}, str(out / "model.safetensors"))
    head_ = load_target_head(out)
    assert (head_.architecture, head_.num_layers, head_.hidden_size, head_.vocab_size) == \
        ("KimiK25ForConditionalGeneration", 5, 32, 100)
    assert torch.equal(head_.embed_weight(), embed) and torch.equal(head_.lm_head_weight(), head)
