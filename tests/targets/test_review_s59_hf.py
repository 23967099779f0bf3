"""Review of targets/hf.py on real directories: a config of the model's own code with a rope_scaling
(Kimi K2's yarn) read as written, the flag reaching the model class that names the head's tensors, and
load_target_head's device resolved as load_target's."""

from __future__ import annotations

import builtins
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from drafter_lab.drafter.config import target_rope_theta
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import REMOTE_CODE_ENV, load_target_config, load_target_head

YARN = {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def _kimi_like(path, rope_scaling, rope_theta):
    """Kimi K2's config.json (model_type kimi_k2, its classes its own code) at a tiny size, and a head."""
    path.mkdir()
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
           "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
           "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 4, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_nope_head_dim": 8,
           "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "max_position_embeddings": 131072, "rope_scaling": rope_scaling, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "vocab_size": 300,
           "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                   "weight_block_size": [128, 128]}}
    if rope_theta is not None:
        cfg["rope_theta"] = rope_theta
    (path / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(300, 32).bfloat16(),
               "lm_head.weight": torch.randn(300, 32).bfloat16()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return tensors


@pytest.mark.parametrize("scaling,theta", [(YARN, 50000.0), (LLAMA3, None)])
def test_a_config_of_its_own_code_with_rope_scaling_is_read_as_written(tmp_path, monkeypatch, scaling, theta):
    """Was an AttributeError (yarn) or KeyError (llama3 without rope_theta) traceback from transformers'
    RoPE checks: train, probe and import-specforge read such a target's head without --trust-remote-code."""
    monkeypatch.setenv(REMOTE_CODE_ENV, "")
    path = tmp_path / "kimi"
    tensors = _kimi_like(path, scaling, theta)
    _, text = load_target_config(path)
    assert (text.num_hidden_layers, text.hidden_size, text.rope_parameters) == (4, 32, scaling)
    assert target_rope_theta(text) == (theta or 10000.0)
    head = load_target_head(path)
    assert (head.architecture, head.num_layers, head.vocab_size) == ("DeepseekV3ForCausalLM", 4, 300)
    assert torch.equal(head.lm_head_weight(), tensors["lm_head.weight"].float())


def test_the_trust_flag_reaches_the_model_class_that_names_the_head(random_llama, tmp_path, monkeypatch):
    """With --trust-remote-code, load_target_head built the model of its own code without the flag, and
    transformers asked "Do you wish to run the custom code? [y/N]" on the terminal (15 s), as if not given."""
    out = tmp_path / "custom"
    shutil.copytree(random_llama, out)
    (out / "configuration_custom.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass CustomConfig(LlamaConfig):\n    model_type = 'custom_llama'\n")
    (out / "modeling_custom.py").write_text(
        "from transformers import LlamaForCausalLM\n\nfrom .configuration_custom import CustomConfig\n\n\n"
        "class CustomForCausalLM(LlamaForCausalLM):\n    config_class = CustomConfig\n")
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(model_type="custom_llama", architectures=["CustomForCausalLM"],
               auto_map={"AutoConfig": "configuration_custom.CustomConfig",
                         "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"})
    (out / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv(REMOTE_CODE_ENV, "1")
    asked = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "n")
    head, plain = load_target_head(out), load_target_head(random_llama)
    assert asked == []
    assert torch.equal(head.lm_head_weight(), plain.lm_head_weight())


def test_the_heads_device_is_resolved_as_the_whole_models(random_llama):
    """"auto" was torch's RuntimeError from deep inside, as were devices this machine lacks."""
    assert load_target_head(random_llama, device="auto").embed_weight().device.type == \
        ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(LabError, match="unknown device 'mps'"):
        load_target_head(random_llama, device="mps")
    if not torch.cuda.is_available():
        with pytest.raises(LabError, match="no CUDA device is visible"):
            load_target_head(random_llama, device="cuda:1")
