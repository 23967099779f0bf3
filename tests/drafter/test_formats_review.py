"""Exports checked against what vLLM and SGLang read from config.json and the weights (replayed, not imported).

vLLM (vllm/model_executor/models/llama_eagle3.py, transformers_utils/configs/speculators/algos.py):
- a speculators config becomes its `transformer_layer_config` plus draft_vocab_size,
  target_hidden_size (only when not null), norm_before_residual (true when absent) and the
  top-level eagle_aux_hidden_state_layer_ids ("capture before layer i", when non-empty);
- `Eagle3LlamaForCausalLM.load_weights`: t2d is skipped, d2t becomes draft_id_to_target_id
  (target id = i + d2t[i]), any other name without "lm_head" gets "model."; inside the model
  "midlayer." is "layers.0." and q/k/v, gate/up go to stacked shards; a name that is no parameter
  is a KeyError (vLLM refuses the file);
- fc takes 3 * target_hidden_size when the config has that attribute, else 3 * hidden_size.
SGLang (python/sglang/srt/models/llama_eagle3.py) reads `config.draft_vocab_size` as an attribute:
null means "the target's head", a missing key an AttributeError.
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from drafter_lab.cli import main
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import load_drafter, save_drafter
from drafter_lab.drafter.config import FORMATS

from .test_model import random_drafter, small_config

STACKED = {".q_proj": ".qkv_proj", ".k_proj": ".qkv_proj", ".v_proj": ".qkv_proj", ".gate_proj": ".gate_up_proj",
           ".up_proj": ".gate_up_proj"}


def vllm_config(c: dict) -> dict:
    """The hf_config attributes vLLM's Eagle3LlamaForCausalLM sees for config.json `c`."""
    if c.get("speculators_model_type") is None:
        return dict(c)
    out = dict(c["transformer_layer_config"])
    out["draft_vocab_size"] = c.get("draft_vocab_size")
    if c.get("target_hidden_size") is not None:
        out["target_hidden_size"] = c["target_hidden_size"]
    out["norm_before_residual"] = c.get("norm_before_residual", True)
    if c.get("eagle_aux_hidden_state_layer_ids"):
        out["eagle_aux_hidden_state_layer_ids"] = c["eagle_aux_hidden_state_layer_ids"]
    return out


def vllm_params(c: dict) -> dict[str, tuple]:
    h, nq, nkv, i = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    d = c.get("head_dim") or h // nq
    n = c.get("draft_vocab_size") or c["vocab_size"]
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": (c["vocab_size"], h),
        "model.fc.weight": (h, 3 * (c["target_hidden_size"] if "target_hidden_size" in c else h)),
        layer + "input_layernorm.weight": (h,), layer + "hidden_norm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,),
        layer + "self_attn.qkv_proj.weight": ((nq + 2 * nkv) * d, 2 * h),
        layer + "self_attn.o_proj.weight": (h, nq * d),
        layer + "mlp.gate_up_proj.weight": (2 * i, h), layer + "mlp.down_proj.weight": (h, i),
        "model.norm.weight": (h,), "lm_head.weight": (n, h), "draft_id_to_target_id": (n,),
    }


def vllm_load(c: dict, tensors: dict) -> dict[str, list]:
    """Where each tensor lands (param -> [shapes]); a KeyError where vLLM would raise one."""
    params, landed = vllm_params(c), {}
    for name, t in tensors.items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "lm_head" not in name:
            name = "model." + name.replace("midlayer.", "layers.0.")
        for old, new in STACKED.items():
            if old in name:
                name = name.replace(old, new)
                break
        if name not in params:
            raise KeyError(name)
        landed.setdefault(name, []).append(tuple(t.shape))
    return landed


def _check_vllm(out, drafter):
    cfg = drafter.config
    raw = json.loads((out / "config.json").read_text())
    c = vllm_config(raw)
    tensors = load_file(str(out / "model.safetensors"))
    params = vllm_params(c)
    landed = vllm_load(c, tensors)
    assert set(landed) == set(params)
    for name, shapes in landed.items():
        if name.endswith(("qkv_proj.weight", "gate_up_proj.weight")):
            assert (sum(s[0] for s in shapes), shapes[0][1]) == params[name], name
        else:
            assert shapes == [params[name]], name
    assert tensors["d2t"].dtype == torch.int64
    assert torch.equal(tensors["d2t"] + torch.arange(cfg.draft_vocab_size),
                       drafter.to_target_ids(torch.arange(cfg.draft_vocab_size)))
    assert torch.equal(tensors["t2d"], drafter.t2d) and tensors["t2d"].dtype == torch.bool
    assert c["eagle_aux_hidden_state_layer_ids"] == cfg.aux_layer_ids  # vLLM captures before layer i
    assert bool(c.get("norm_before_residual", False)) is cfg.norm_before_residual
    assert c["rope_theta"] == cfg.rope_theta and c["rms_norm_eps"] == cfg.rms_norm_eps


def test_both_layouts_are_what_vllm_loads(tmp_path):
    drafter = random_drafter(small_config(), seed=41, dtype=torch.float32)
    save_drafter(drafter, tmp_path / "sglang")
    export(tmp_path, "speculators")
    for fmt in FORMATS:
        _check_vllm(tmp_path / fmt, drafter)


def export(tmp_path, fmt):
    assert main(["export", "--drafter", str(tmp_path / "sglang"), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0


def test_a_head_less_sglang_export_says_draft_vocab_size_null(tmp_path):
    """SGLang's LlamaForCausalLMEagle3 reads `config.draft_vocab_size`: null loads the target's head,
    a missing key was an AttributeError at startup."""
    drafter = random_drafter(small_config(draft_vocab_size=101, target_hidden_size=48), seed=42, dtype=torch.float32)
    drafter.d2t.zero_()
    drafter.t2d.fill_(True)
    save_drafter(drafter, tmp_path / "src", head=False)
    assert main(["export", "--drafter", str(tmp_path / "src"), "--format", "sglang", "--out",
                 str(tmp_path / "sglang")]) == 0
    for out in (tmp_path / "src", tmp_path / "sglang"):
        raw = json.loads((out / "config.json").read_text())
        assert "draft_vocab_size" in raw and raw["draft_vocab_size"] is None
        assert LlamaConfig(**{k: v for k, v in raw.items() if k != "architectures"}).draft_vocab_size is None
        assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))
        assert formats.parse_config(raw, "c")[0] == drafter.config
    _check_vllm_head_less(tmp_path / "sglang", drafter)
    head = torch.randn(101, 48)
    target = type("T", (), {"hidden_size": 48, "embed_weight": lambda self: drafter.embed_tokens.weight,
                            "lm_head_weight": lambda self: head})()
    back = load_drafter(tmp_path / "sglang", target=target)
    assert torch.equal(back.lm_head.weight, head) and torch.equal(back.fc.weight, drafter.fc.weight)


def _check_vllm_head_less(out, drafter):
    c = vllm_config(json.loads((out / "config.json").read_text()))
    landed = vllm_load(c, load_file(str(out / "model.safetensors")))
    assert set(vllm_params(c)) - set(landed) == {"lm_head.weight"}  # vLLM shares its target's
    assert vllm_params(c)["draft_id_to_target_id"] == (drafter.config.target_vocab_size,)
