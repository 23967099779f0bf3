"""Our SGLang export against what sglang 0.5.23's EAGLE-3 loader reads (pinned, not imported).

sglang cannot be installed here (CUDA-only dependencies), so this pins, from the 0.5.23 wheel's
python/sglang/srt/models/llama_eagle3.py and llama.py, exactly what `LlamaForCausalLMEagle3` reads:

- parameters (`named_parameters()`): model.embed_tokens.weight, model.fc.weight, model.norm.weight,
  lm_head.weight and, for layer 0, input_layernorm, hidden_norm, post_attention_layernorm,
  self_attn.qkv_proj (q, k, v stacked; input width 2 * hidden_size), self_attn.o_proj,
  mlp.gate_up_proj (gate, up stacked), mlp.down_proj;
- `load_weights(name, tensor)`: a name containing "midlayer" is renamed to "layers.0"; "d2t" becomes
  hot_token_id = d2t + arange(N); "t2d" is skipped; q/k/v_proj and gate/up_proj go to their stacked
  shards; otherwise the name, or "model." + name, must be a parameter. Anything else is dropped
  without a word, which is why every exported name is checked to land somewhere;
- config: fc input = target_hidden_size (if present, else hidden_size) x number of aux ids
  (eagle_config.eagle_aux_hidden_state_layer_ids, default 3); lm_head has draft_vocab_size rows
  (None would load the target's lm_head instead); tie_word_embeddings must be false; hidden_act,
  rms_norm_eps, head_dim, num_key_value_heads, rope_theta, max_position_embeddings as Llama; the
  target captures aux states before layer id + 1 (`set_eagle3_layers_to_capture`);
  norm_before_fc / fc_norm / use_aux_norm / norm_output / bias switch on other math.
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from drafter_lab.drafter.checkpoint import save_drafter

from .test_model import random_drafter, small_config

SGLANG_VERSION = "0.5.23"
LEGACY = {"midlayer": "layers.0"}
STACKED = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
           ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}
NEUTRAL_SWITCHES = ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output", "bias")


def sglang_params(c: dict) -> dict[str, tuple]:
    """Parameter shapes of sglang 0.5.23's LlamaForCausalLMEagle3 for config `c` (tp = 1)."""
    h, d = c["hidden_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    n_aux = len((c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
    h_in = c.get("target_hidden_size", h)
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": (c["vocab_size"], h),
        "model.fc.weight": (h, h_in * n_aux),
        layer + "input_layernorm.weight": (h,),
        layer + "hidden_norm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,),
        layer + "self_attn.qkv_proj.weight": ((nq + 2 * nkv) * d, 2 * h),
        layer + "self_attn.o_proj.weight": (h, nq * d),
        layer + "mlp.gate_up_proj.weight": (2 * c["intermediate_size"], h),
        layer + "mlp.down_proj.weight": (h, c["intermediate_size"]),
        "model.norm.weight": (h,),
        # read as an attribute (config.draft_vocab_size): a config without the field stops it; null is the target's
        "lm_head.weight": (c["draft_vocab_size"] or c["vocab_size"], h),
    }


def sglang_load(c: dict, tensors: dict):
    """Replay 0.5.23's load_weights name handling: where each tensor lands, and what it drops."""
    params = sglang_params(c)
    landed: dict[str, list] = {}
    dropped, hot = [], None
    for name, t in tensors.items():
        for old, new in LEGACY.items():
            if old in name:
                name = name.replace(old, new)
        if "d2t" in name:
            hot = t + torch.arange(t.shape[0])
            continue
        if "t2d" in name:
            continue
        shard = None
        for suffix, (stacked, sid) in STACKED.items():
            if suffix in name:
                name, shard = name.replace(suffix, stacked), sid
                break
        target = name if name in params else f"model.{name}"
        if target not in params:
            dropped.append(name)
            continue
        landed.setdefault(target, []).append((shard, tuple(t.shape)))
    return params, landed, dropped, hot


def stacked_shape(parts: list) -> tuple:
    order = {"q": 0, "k": 1, "v": 2, 0: 0, 1: 1}
    parts = sorted(parts, key=lambda p: order[p[0]])
    return (sum(s[0] for _, s in parts), parts[0][1][1])


def check_export(tmp_path, cfg, head=True):
    drafter = random_drafter(cfg, seed=31, dtype=torch.float32)
    save_drafter(drafter, tmp_path, head=head)
    c = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    params, landed, dropped, hot = sglang_load(c, tensors)

    assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["model_type"] == "llama"
    assert c["num_hidden_layers"] == 1 and c["hidden_act"] == "silu" and c["tie_word_embeddings"] is False
    if head:
        assert c["draft_vocab_size"] == cfg.draft_vocab_size  # not None: our lm_head, not the target's
    else:  # None: sglang loads the target's lm_head (load_lm_head_from_target), the one it has no file for
        assert c["draft_vocab_size"] is None and "lm_head.weight" not in tensors
        params.pop("lm_head.weight")
    assert not any(c.get(k) or (c.get("eagle_config") or {}).get(k) for k in NEUTRAL_SWITCHES)
    for key in ("rms_norm_eps", "rope_theta", "max_position_embeddings", "head_dim", "num_key_value_heads"):
        assert c[key] == getattr(cfg, key)
    assert c["vocab_size"] == cfg.target_vocab_size
    assert ("target_hidden_size" in c) == (cfg.target_hidden_size != cfg.hidden_size)
    # sglang's target captures before layer id + 1, i.e. HF hidden_states index id + 1 == ours
    assert [i + 1 for i in c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]] == cfg.aux_layer_ids

    assert dropped == [], f"sglang {SGLANG_VERSION} would silently ignore {dropped}"
    assert set(landed) == set(params), f"parameters left unloaded: {set(params) - set(landed)}"
    for name, parts in landed.items():
        shape = stacked_shape(parts) if parts[0][0] is not None else parts[0][1]
        assert shape == params[name], name
    assert torch.equal(hot, drafter.to_target_ids(torch.arange(cfg.draft_vocab_size)))


def test_export_is_what_sglang_0_5_23_loads(tmp_path):
    check_export(tmp_path, small_config(target_hidden_size=48))


def test_export_with_other_target_hidden_size(tmp_path):
    check_export(tmp_path, small_config(target_hidden_size=40))


def test_a_drafter_sharing_its_targets_head_exports_as_sglang_loads_it(tmp_path):
    check_export(tmp_path, small_config(target_hidden_size=48, draft_vocab_size=101), head=False)


def test_a_name_sglang_would_drop_is_caught():
    """The replayed loader is strict enough to notice a wrong name (the check can fail)."""
    c = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16,
         "vocab_size": 10, "draft_vocab_size": 4}
    _, _, dropped, _ = sglang_load(c, {"decoder.fc.weight": torch.zeros(8, 24)})
    assert dropped == ["decoder.fc.weight"]
