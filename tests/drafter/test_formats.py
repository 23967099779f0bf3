"""Checkpoint layouts: export then import is the identity; foreign layouts import; bad ones are refused."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.cli import main
from drafter_lab.data.vocab import DraftVocab
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import export, load_drafter, read_checkpoint, read_vocab, save_drafter
from drafter_lab.drafter.config import FORMATS
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.drafter.transfer import init_from
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config


@pytest.fixture
def drafter():
    return random_drafter(small_config(), seed=11, dtype=torch.float32)


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_then_import_is_identical(tmp_path, drafter, fmt):
    save_drafter(drafter, tmp_path / "ours")
    export(tmp_path / "ours", fmt, tmp_path / fmt)
    back = load_drafter(tmp_path / fmt)
    assert_same_state(drafter, back)
    assert back.config == drafter.config
    # and back again into the SGLang layout: same tensors under the same names
    export(tmp_path / fmt, formats.SGLANG, tmp_path / "again")
    a, b = load_file(str(tmp_path / "ours/model.safetensors")), load_file(str(tmp_path / "again/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_layouts_name_and_convert_as_documented(tmp_path, drafter):
    cfg = drafter.config
    save_drafter(drafter, tmp_path / "sg")
    export(tmp_path / "sg", formats.SPECULATORS, tmp_path / "sp")
    sg = json.loads((tmp_path / "sg/config.json").read_text())
    sp = json.loads((tmp_path / "sp/config.json").read_text())
    assert sg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert sg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in cfg.aux_layer_ids]
    assert sg["eagle_aux_hidden_state_layer_ids"] == cfg.aux_layer_ids  # where vLLM, serving this layout, looks
    assert sg["target_hidden_size"] == cfg.target_hidden_size
    assert sp["architectures"] == ["Eagle3Speculator"] and sp["speculators_model_type"] == "eagle3"
    assert sp["eagle_aux_hidden_state_layer_ids"] == cfg.aux_layer_ids
    assert sp["transformer_layer_config"]["vocab_size"] == cfg.target_vocab_size
    assert sp["norm_before_residual"] is False
    names_sp = set(load_file(str(tmp_path / "sp/model.safetensors")))
    assert "layers.0.self_attn.q_proj.weight" in names_sp and not any(n.startswith("midlayer.") for n in names_sp)
    names_sg = set(load_file(str(tmp_path / "sg/model.safetensors")))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names_sg


def test_bf16_export_round_trips_bits(tmp_path, drafter):
    save_drafter(drafter, tmp_path / "a")
    export(tmp_path / "a", formats.SGLANG, tmp_path / "b", dtype=torch.bfloat16)
    export(tmp_path / "b", formats.SPECULATORS, tmp_path / "c")
    b, c = load_file(str(tmp_path / "b/model.safetensors")), load_file(str(tmp_path / "c/model.safetensors"))
    assert b["fc.weight"].dtype == torch.bfloat16
    assert torch.equal(b["midlayer.mlp.up_proj.weight"], c["layers.0.mlp.up_proj.weight"])


def _foreign(tmp_path, drafter, name, rename, config, file="model.safetensors", drop=()):
    d = tmp_path / name
    d.mkdir()
    state = {rename(k): v.clone() for k, v in drafter.state_dict().items() if k not in drop}
    if file.endswith(".bin"):
        torch.save(state, d / file)
    else:
        save_file(state, str(d / file))
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_imports_specforge_eagle_and_speculators_names(tmp_path, drafter):
    cfg = drafter.config
    llama = formats.sglang_config(cfg, torch.float32)
    # SpecForge: midlayer.* names, "output of layer k" aux ids, embed_tokens included
    spec = _foreign(tmp_path, drafter, "specforge", lambda k: k, llama)
    # EAGLE (yuhuili-style): pytorch_model.bin, no embed_tokens, no eagle_config
    eagle_cfg = {k: v for k, v in llama.items() if k not in ("eagle_config", "eagle_aux_hidden_state_layer_ids")}
    eagle = _foreign(tmp_path, drafter, "eagle", lambda k: k, eagle_cfg, file="pytorch_model.bin",
                     drop=("embed_tokens.weight",))
    # speculators: layers.0.* names, verifier head present (ignored)
    sp_cfg = formats.speculators_config(cfg, torch.float32)
    sp = _foreign(tmp_path, drafter, "speculators", lambda k: k.replace("midlayer.", "layers.0."), sp_cfg)
    state = load_file(str(sp / "model.safetensors"))
    state["verifier_lm_head.weight"] = torch.randn(5, cfg.hidden_size)
    save_file(state, str(sp / "model.safetensors"))

    assert_same_state(load_drafter(spec), drafter)
    assert_same_state(load_drafter(sp), drafter)
    assert read_checkpoint(sp).format == formats.SPECULATORS
    with pytest.raises(LabError, match="embed_tokens.weight"):
        load_drafter(eagle)
    back = load_drafter(eagle, embed_weight=drafter.embed_tokens.weight)
    assert_same_state(back, drafter)
    assert back.config.aux_layer_ids == []  # unknown: the file does not say
    # as in SGLang, a serving target of the same width supplies the embedding, even over the file's
    own = torch.randn_like(drafter.embed_tokens.weight)
    target = SimpleNamespace(hidden_size=cfg.hidden_size, embed_weight=lambda: own)
    assert torch.equal(load_drafter(spec, target=target).embed_tokens.weight, own)
    assert torch.equal(load_drafter(eagle, target=target).embed_tokens.weight, own)


def test_missing_tensor_names_tensor_and_file(tmp_path, drafter):
    llama = formats.sglang_config(drafter.config, torch.float32)
    d = _foreign(tmp_path, drafter, "broken", lambda k: k, llama, drop=("midlayer.mlp.down_proj.weight",))
    with pytest.raises(LabError, match=r"model\.safetensors.*'midlayer\.mlp\.down_proj\.weight'"):
        read_checkpoint(d)
    out = tmp_path / "out"
    assert main(["export", "--drafter", str(d), "--format", "speculators", "--out", str(out)]) == 2
    assert not out.exists()


def test_shape_mismatch_names_tensor(tmp_path, drafter):
    llama = formats.sglang_config(drafter.config, torch.float32)
    d = _foreign(tmp_path, drafter, "wrong", lambda k: k, llama)
    state = load_file(str(d / "model.safetensors"))
    state["midlayer.self_attn.o_proj.weight"] = state["midlayer.self_attn.o_proj.weight"][:, :-1].contiguous()
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(LabError, match="midlayer.self_attn.o_proj.weight"):
        load_drafter(d)


def test_a_non_float_weight_or_a_config_not_an_object_is_one_line_naming_the_file(tmp_path, drafter):
    d = _foreign(tmp_path, drafter, "bool", lambda k: k, formats.sglang_config(drafter.config, torch.float32))
    state = load_file(str(d / "model.safetensors"))
    save_file({**state, "fc.weight": state["fc.weight"] > 0}, str(d / "model.safetensors"))
    with pytest.raises(LabError) as e:
        load_drafter(d)
    assert str(e.value) == f"{d / 'model.safetensors'}: tensor 'fc.weight' is torch.bool, not a floating-point weight"
    (d / "config.json").write_text("[1, 2]")
    for read in (read_checkpoint, read_vocab):
        with pytest.raises(LabError) as e:
            read(d)
        assert str(e.value) == f"{d / 'config.json'}: config is list, not a JSON object"


def test_an_export_without_a_dtype_keeps_each_tensors_own(tmp_path, drafter):
    """A mixed-precision save (bf16 linears, fp32 norms) keeps its fp32 norms; a dtype casts them all."""
    mixed = {k: v.bfloat16() if v.ndim == 2 else v for k, v in drafter.state_dict().items()}
    d = _foreign(tmp_path, drafter, "mixed", lambda k: k, formats.sglang_config(drafter.config, torch.bfloat16))
    save_file(mixed, str(d / "model.safetensors"))
    export(d, formats.SPECULATORS, tmp_path / "sp")
    out = load_file(str(tmp_path / "sp/model.safetensors"))
    for name, t in mixed.items():
        assert out[formats.export_name(name, formats.SPECULATORS)].dtype == t.dtype, name
        assert torch.equal(out[formats.export_name(name, formats.SPECULATORS)], t), name
    assert json.loads((tmp_path / "sp/config.json").read_text())["torch_dtype"] == "bfloat16"
    export(d, formats.SGLANG, tmp_path / "bf16", dtype=torch.bfloat16)
    assert {t.dtype for t in load_file(str(tmp_path / "bf16/model.safetensors")).values() if t.is_floating_point()} \
        == {torch.bfloat16}


def test_unsupported_variant_and_truncated_file(tmp_path, drafter):
    cfg = formats.sglang_config(drafter.config, torch.float32)
    d = _foreign(tmp_path, drafter, "variant", lambda k: k, {**cfg, "norm_before_fc": True})
    with pytest.raises(LabError, match="norm_before_fc"):
        read_checkpoint(d)
    t = _foreign(tmp_path, drafter, "trunc", lambda k: k, cfg)
    blob = (t / "model.safetensors").read_bytes()
    (t / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(LabError, match="truncated or corrupt"):
        read_checkpoint(t)


def _with_layer(cfg, **over):
    return {**cfg, "transformer_layer_config": {**cfg["transformer_layer_config"], **over}}


@pytest.mark.parametrize("layout, change, refusal", [
    ("sglang", lambda c: {**c, "architectures": ["GptOssForCausalLMEagle3"]}, "architecture 'GptOssForCausalLMEagle3'"),
    ("sglang", lambda c: {**c, "architectures": ["DFlashDraftModel"]}, "architecture 'DFlashDraftModel'"),
    ("speculators", lambda c: {**c, "speculators_model_type": "eagle"}, "speculators model type 'eagle'"),
    ("speculators", lambda c: _with_layer(c, model_type="qwen3"), "model_type 'qwen3'"),
    ("sglang", lambda c: {**c, "attention_bias": True}, "attention_bias=true"),
    ("sglang", lambda c: {**c, "additional_fc": True}, "additional_fc=true"),
    ("sglang", lambda c: {**c, "hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh'"),
    ("speculators", lambda c: _with_layer(c, mlp_bias=True), "mlp_bias=true"),
    ("sglang", lambda c: {**c, "eagle_config": {**c["eagle_config"], "use_aux_hidden_state": False}},
     "use_aux_hidden_state=false"),
    ("sglang", lambda c: {**c, "logit_scale": 0.5}, "logit_scale 0.5"),
])
def test_drafters_of_another_family_are_refused_not_read_as_llama(drafter, layout, change, refusal):
    cfg = formats.config_for(layout, drafter.config, torch.float32)
    with pytest.raises(LabError, match=refusal) as e:
        formats.parse_config(change(cfg), "cfg.json")
    assert str(e.value).startswith("cfg.json: ")


def _without(cfg, *keys):
    return {k: v for k, v in cfg.items() if k not in keys}


@pytest.mark.parametrize("layout, change, problem", [
    ("sglang", lambda c: {**_without(c, "head_dim"), "num_attention_heads": 0},
     "'num_attention_heads' is 0, not a positive integer"),
    ("sglang", lambda c: {**c, "eagle_config": {"eagle_aux_hidden_state_layer_ids": "1,3,4"}},
     "'eagle_aux_hidden_state_layer_ids' is '1,3,4', not a list of integers"),
    ("speculators", lambda c: {**c, "eagle_aux_hidden_state_layer_ids": "1,3,4"},
     "'eagle_aux_hidden_state_layer_ids' is '1,3,4', not a list of integers"),
    ("sglang", lambda c: {**c, "eagle_config": [1, 3, 4]}, "'eagle_config' is [1, 3, 4], not a JSON object"),
    ("sglang", lambda c: {**c, "hidden_size": "48"}, "'hidden_size' is '48', not a positive integer"),
    ("speculators", lambda c: _with_layer(c, rms_norm_eps=-1e-5), "'rms_norm_eps' is -1e-05, not a positive number"),
    ("speculators", lambda c: _with_layer(c, rope_theta="big"), "'rope_theta' is 'big', not a positive number"),
    # JSON's Infinity: an eps that zeroes every norm, a theta that turns RoPE off
    ("sglang", lambda c: {**c, "rms_norm_eps": float("inf")}, "'rms_norm_eps' is inf, not a positive number"),
    ("speculators", lambda c: _with_layer(c, rope_theta=float("inf")), "'rope_theta' is inf, not a positive number"),
    ("speculators", lambda c: {**c, "transformer_layer_config": "llama"},
     "'transformer_layer_config' is 'llama', not a JSON object"),
    # a string "false" is truthy: read as true it would build another model, or refuse a plain one
    ("sglang", lambda c: {**c, "norm_before_residual": "false"}, "'norm_before_residual' is 'false', not true or false"),
    ("speculators", lambda c: {**c, "norm_before_residual": "false"},
     "'norm_before_residual' is 'false', not true or false"),
    ("sglang", lambda c: {**c, "tie_word_embeddings": "false"}, "'tie_word_embeddings' is 'false', not true or false"),
    ("sglang", lambda c: {**c, "attention_bias": "false"}, "'attention_bias' is 'false', not true or false"),
    ("speculators", lambda c: _with_layer(c, mlp_bias=0), "'mlp_bias' is 0, not true or false"),
    ("sglang", lambda c: {**c, "eagle_config": {**c["eagle_config"], "use_aux_hidden_state": "false"}},
     "'use_aux_hidden_state' is 'false', not true or false"),
    ("sglang", lambda c: {**c, "num_key_value_heads": 3}, "num_attention_heads (4) is not a multiple of "
     "num_key_value_heads (3)"),
    ("speculators", lambda c: _with_layer(c, head_dim=15), "head_dim 15 is odd: RoPE needs an even one"),
    # a string was read letter by letter: "drafter architecture 'L' is not supported"
    ("sglang", lambda c: {**c, "architectures": "LlamaForCausalLMEagle3"},
     "'architectures' is 'LlamaForCausalLMEagle3', not a list of class names"),
])
def test_a_malformed_config_value_is_one_line_naming_the_file(drafter, layout, change, problem):
    cfg = formats.config_for(layout, drafter.config, torch.float32)
    with pytest.raises(LabError) as e:
        formats.parse_config(change(cfg), "cfg.json")
    assert str(e.value) == f"cfg.json: config's {problem}"


def test_vllms_top_level_aux_ids_are_read_as_vllm_reads_them(drafter):
    """vLLM's own Eagle3LlamaForCausalLM configs carry the ids at the top level, as hf_hidden_states
    indices (vLLM reads only those); SGLang's eagle_config holds "output of layer i" (one less)."""
    sg = formats.sglang_config(drafter.config, torch.float32)
    top = {"eagle_aux_hidden_state_layer_ids": drafter.config.aux_layer_ids}
    vllm = {**_without(sg, "eagle_config"), "architectures": ["Eagle3LlamaForCausalLM"], **top}
    assert formats.parse_config(vllm, "c")[0].aux_layer_ids == [2, 4, 5] == drafter.config.aux_layer_ids
    assert formats.parse_config({**sg, **top}, "c")[0].aux_layer_ids == [2, 4, 5]  # both, agreeing
    with pytest.raises(LabError) as e:
        formats.parse_config({**sg, "eagle_aux_hidden_state_layer_ids": [1, 3, 4]}, "c")
    assert str(e.value) == ("c: config's aux layer ids disagree: eagle_config's [1, 3, 4] (output of layer i, "
                            "hidden_states [2, 4, 5]) and the top-level [1, 3, 4] (hidden_states)")


def test_a_missing_norm_before_residual_reads_as_vllm_and_sglang_read_it(drafter):
    """vLLM's speculators reader (update_eagle3) takes a speculators config without the field as
    speculators' default, true; SGLang's layout has no such default: plain EAGLE-3."""
    sp = formats.speculators_config(drafter.config, torch.float32)
    assert formats.parse_config(_without(sp, "norm_before_residual"), "c")[0].norm_before_residual is True
    assert formats.parse_config(sp, "c")[0].norm_before_residual is False  # written, as every export writes it
    sg = formats.sglang_config(drafter.config, torch.float32)
    assert "norm_before_residual" not in sg and formats.parse_config(sg, "c")[0].norm_before_residual is False
    # null, as vLLM passes it on (None: the plain residual); the other flags read null as their default
    assert formats.parse_config({**sp, "norm_before_residual": None}, "c")[0].norm_before_residual is False
    nulls = {"norm_before_residual": None, "tie_word_embeddings": None, "attention_bias": None}
    assert formats.parse_config({**sg, **nulls, "eagle_config": {**sg["eagle_config"], "use_aux_hidden_state": None}},
                                "c")[0] == formats.parse_config(sg, "c")[0]


@pytest.mark.parametrize("arch", formats.LLAMA_EAGLE3_ARCHS)
def test_every_name_of_llama_eagle3_reads_the_same(drafter, arch):
    cfg = formats.sglang_config(drafter.config, torch.float32)
    assert formats.parse_config({**cfg, "architectures": [arch]}, "cfg.json") == (drafter.config, "sglang")
    bare = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
    assert formats.parse_config(bare, "cfg.json") == (drafter.config, "sglang")


@pytest.mark.parametrize("model_type", ["kimi_k2", "qwen3"])
def test_an_sglang_drafter_is_read_by_its_architecture_whatever_model_type_it_copied(tmp_path, drafter, model_type):
    """SpecForge's Kimi-K2 draft config keeps the target's model_type "kimi_k2" beside LlamaForCausalLMEagle3,
    which SGLang and vLLM build as the Llama layer it is (that drafter was refused). A tensor that layer
    lacks is refused still (the other test below), and the export says "llama"."""
    save_drafter(drafter, tmp_path / "d")
    cfg_file = tmp_path / "d" / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), "model_type": model_type}))
    assert formats.parse_config(json.loads(cfg_file.read_text()), cfg_file) == (drafter.config, "sglang")
    assert_same_state(load_drafter(tmp_path / "d"), drafter)
    export(tmp_path / "d", "sglang", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llama"


@pytest.mark.parametrize("layout", FORMATS)
def test_a_midlayer_tensor_of_another_family_is_refused_naming_it(tmp_path, drafter, layout):
    cfg = formats.config_for(layout, drafter.config, torch.float32)
    d = _foreign(tmp_path, drafter, "plain", lambda k: formats.export_name(k, layout), cfg)
    weights = d / "model.safetensors"
    state = load_file(str(weights))
    q = formats.export_name("midlayer.self_attn.q_proj", layout)
    # A zero bias and RoPE's saved buffer change nothing: read as before.
    save_file({**state, f"{q}.bias": torch.zeros(len(state[f"{q}.weight"])),
               formats.export_name("midlayer.self_attn.rotary_emb.inv_freq", layout): torch.ones(4)}, str(weights))
    assert_same_state(load_drafter(d), drafter)
    report = init_from(Eagle3Drafter(drafter.config), d, SimpleNamespace(), DraftVocab(drafter.d2t, drafter.t2d))
    assert not any("bias" in r["tensor"] or "inv_freq" in r["tensor"] for r in report.skipped + report.loaded)
    for extra, value in ((f"{q}.bias", torch.ones(len(state[f"{q}.weight"]))),
                         (formats.export_name("midlayer.self_attn.q_norm.weight", layout), torch.ones(4)),
                         ("layers.1.mlp.down_proj.weight", state[formats.export_name("midlayer.mlp.down_proj.weight",
                                                                                     layout)].clone())):
        save_file({**state, extra: value}, str(weights))
        with pytest.raises(LabError, match=f"tensor '{extra}' is not part of a Llama EAGLE-3 midlayer") as e:
            read_checkpoint(d)
        assert str(e.value).startswith(f"{weights}: ")


def test_a_top_level_tensor_load_would_drop_is_refused_naming_it(tmp_path, drafter):
    """A non-zero lm_head.bias or norm.bias changes the logits, and load and export dropped it without a word
    (only init_from refused it); a head or embedding of the wrong rank was a TypeError or IndexError."""
    d = _foreign(tmp_path, drafter, "top", lambda k: k, formats.sglang_config(drafter.config, torch.float32))
    weights = d / "model.safetensors"
    state = load_file(str(weights))
    save_file({**state, "lm_head.bias": torch.zeros(len(state["lm_head.weight"]))}, str(weights))  # zero: changes nothing
    assert_same_state(load_drafter(d), drafter)
    vocab = DraftVocab(drafter.d2t, drafter.t2d)
    for extra, value in (("lm_head.bias", torch.full((len(state["lm_head.weight"]),), 5.0)), ("norm.bias", torch.ones(4)),
                         ("lm_head.weight", torch.tensor(1.0)), ("lm_head.weight", state["lm_head.weight"][0])):
        save_file({**state, extra: value}, str(weights))
        for read in (load_drafter, lambda p: init_from(Eagle3Drafter(drafter.config), p, SimpleNamespace(), vocab),
                     lambda p: export(p, "sglang", tmp_path / "out")):
            with pytest.raises(LabError, match=f"^{weights}: tensor '{extra}' ") as e:
                read(d)
            assert "not part of a Llama EAGLE-3 drafter" in str(e.value) or "not [rows, hidden]" in str(e.value)
    save_file({**state, "verifier_norm.weight": torch.ones(4)}, str(weights))  # SpecForge saves its target's: carried
    assert_same_state(load_drafter(d), drafter)


def test_export_cli(tmp_path, drafter):
    save_drafter(drafter, tmp_path / "src")
    assert main(["export", "--drafter", str(tmp_path / "src"), "--format", "speculators",
                 "--out", str(tmp_path / "dst"), "--dtype", "bfloat16"]) == 0
    cfg = json.loads((tmp_path / "dst/config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    before = (tmp_path / "dst/model.safetensors").read_bytes()
    assert main(["export", "--drafter", str(tmp_path / "src"), "--format", "sglang", "--out", str(tmp_path / "dst")]) == 2
    assert (tmp_path / "dst/model.safetensors").read_bytes() == before  # an existing directory is never replaced


def test_a_speculators_export_tells_vllm_the_draft_length_and_verifier(tmp_path, drafter, capsys):
    """vLLM takes the proposal's speculative_tokens as num_speculative_tokens unless --speculative-config
    sets it, and `vllm serve DRAFTER` serves the verifier: the trained TTT depth by default (not a fixed 3),
    speculators' 5 for a drafter from elsewhere, or what the flags say."""
    save_drafter(drafter, tmp_path / "src")

    def exported(name, *flags):
        assert main(["export", "--drafter", str(tmp_path / "src"), "--format", "speculators",
                     "--out", str(tmp_path / name), *flags]) == 0
        sc = json.loads((tmp_path / name / "config.json").read_text())["speculators_config"]
        return sc["proposal_methods"][0]["speculative_tokens"], sc["verifier"]

    assert exported("elsewhere") == (5, {"name_or_path": None, "architectures": []})
    (tmp_path / "src/run.json").write_text(json.dumps({"config": {"ttt_steps": 7},
                                                        "target": {"architecture": "LlamaForCausalLM"}}))
    assert exported("trained") == (7, {"name_or_path": None, "architectures": []})
    assert exported("set", "--speculative-tokens", "3", "--verifier", "meta-llama/Llama-3.1-8B-Instruct") == \
        (3, {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "architectures": ["LlamaForCausalLM"]})
    capsys.readouterr()
    assert main(["export", "--drafter", str(tmp_path / "src"), "--format", "sglang", "--out", str(tmp_path / "s"),
                 "--speculative-tokens", "3"]) == 2
    assert "apply to --format speculators" in capsys.readouterr().err
    (tmp_path / "src/run.json").write_text("[]")
    assert main(["export", "--drafter", str(tmp_path / "src"), "--format", "speculators", "--out", str(tmp_path / "b")]) == 2
    assert f"{tmp_path / 'src/run.json'}: not a run record" in capsys.readouterr().err


def _whole_vocab_drafter():
    """A drafter over the target's whole vocabulary (draft ids are target ids), hidden = target hidden."""
    d = random_drafter(small_config(draft_vocab_size=101, target_hidden_size=48), seed=12, dtype=torch.float32)
    d.d2t.zero_()
    d.t2d.fill_(True)
    return d


def _serving_target(cfg, seed=3):
    g = torch.Generator().manual_seed(seed)
    embed, head = (torch.randn(cfg.target_vocab_size, cfg.hidden_size, generator=g) for _ in range(2))
    return SimpleNamespace(hidden_size=cfg.hidden_size, embed_weight=lambda: embed, lm_head_weight=lambda: head)


def test_a_head_without_draft_vocab_size_is_noted_as_sglang_would_replace_it(tmp_path, monkeypatch):
    """SGLang loads its target's lm_head over the file's when the config has no draft_vocab_size; vLLM
    (and the lab) use the file's: the engines disagree, and reading such a drafter says so."""
    from drafter_lab.drafter import checkpoint

    drafter = _whole_vocab_drafter()
    config = formats.sglang_config(drafter.config, torch.float32)
    lines = []
    monkeypatch.setattr(checkpoint, "log", lines.append)
    read_checkpoint(_foreign(tmp_path, drafter, "sized", lambda k: k, config))
    assert lines == []
    bare = _foreign(tmp_path, drafter, "bare", lambda k: k, {k: v for k, v in config.items() if k != "draft_vocab_size"})
    null = _foreign(tmp_path, drafter, "null", lambda k: k, {**config, "draft_vocab_size": None})
    assert read_checkpoint(bare).has_head and read_checkpoint(null).has_head
    want = "draft_vocab_size is absent or null, so SGLang would serve this drafter with its target's lm_head"
    assert len(lines) == 2 and all(want in line for line in lines)


def test_a_drafter_sharing_its_targets_head_and_vocab_loads_as_engines_serve_it(tmp_path):
    """No lm_head, d2t or t2d in the file: SGLang (draft_vocab_size absent) and vLLM serve such a drafter
    with the target's head over the whole vocabulary, draft ids being target ids."""
    drafter = _whole_vocab_drafter()
    cfg = drafter.config
    config = {k: v for k, v in formats.sglang_config(cfg, torch.float32).items() if k != "draft_vocab_size"}
    d = _foreign(tmp_path, drafter, "shared", lambda k: k, config, drop=("lm_head.weight", "d2t", "t2d"))
    target = _serving_target(cfg)
    back = load_drafter(d, target=target)
    assert torch.equal(back.lm_head.weight, target.lm_head_weight())
    assert torch.equal(back.d2t, torch.zeros(101, dtype=torch.long)) and bool(back.t2d.all())
    assert torch.equal(back.embed_tokens.weight, target.embed_weight())
    for name, t in drafter.state_dict().items():
        if name not in ("lm_head.weight", "embed_tokens.weight"):
            assert torch.equal(back.state_dict()[name], t), name
    with pytest.raises(LabError, match=r"lacks tensor 'lm_head.weight' \(it shares its target's: pass the target\)"):
        load_drafter(d)
    narrow = SimpleNamespace(hidden_size=40, embed_weight=None, lm_head_weight=lambda: torch.zeros(101, 40))
    with pytest.raises(LabError, match="shares its target's lm_head, but the target's is 40 wide"):
        load_drafter(d, target=narrow)

    # exported, it stays head-less: SGLang's config with draft_vocab_size null, no lm_head in either layout
    for fmt in FORMATS:
        assert main(["export", "--drafter", str(d), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
        names = set(load_file(str(tmp_path / fmt / "model.safetensors")))
        assert not any("lm_head" in n for n in names) and {"d2t", "t2d"} <= names
        assert_same_state(load_drafter(tmp_path / fmt, target=target), back)
    assert json.loads((tmp_path / "sglang/config.json").read_text())["draft_vocab_size"] is None


def test_a_missing_t2d_is_derived_and_a_missing_d2t_or_head_needs_the_whole_vocab(tmp_path, capsys):
    drafter = random_drafter(small_config(), seed=13, dtype=torch.float32)
    llama = formats.sglang_config(drafter.config, torch.float32)
    no_t2d = _foreign(tmp_path, drafter, "no_t2d", lambda k: k, llama, drop=("t2d",))
    assert torch.equal(load_drafter(no_t2d).t2d, drafter.t2d)  # SGLang and vLLM never read it
    cases = {
        "no_d2t": (("d2t",), {}, r"no 'd2t' tensor, yet the draft vocab \(37\) is not the target's \(101\)"),
        "no_head": (("lm_head.weight",), {}, r"lacks tensor 'lm_head.weight', yet its draft vocab \(37\) is smaller"),
        "tied": ((), {"tie_word_embeddings": True}, "tie_word_embeddings=true: SGLang would take the embedding"),
    }
    for name, (drop, over, message) in cases.items():
        d = _foreign(tmp_path, drafter, name, lambda k: k, {**llama, **over}, drop=drop)
        with pytest.raises(LabError, match=message):
            read_checkpoint(d)
    sizes = {"short_d2t": ("d2t", lambda t: t[:-1], "d2t has 36 entries, the config's draft_vocab_size is 37"),
             "short_t2d": ("t2d", lambda t: t[:-1], "t2d has 100 entries, the config's vocab_size is 101"),
             "rows": ("lm_head.weight", lambda t: t[:-1], "'lm_head.weight' has 36 rows, the config's draft_vocab_size")}
    for name, (tensor, cut, message) in sizes.items():
        d = _foreign(tmp_path, drafter, name, lambda k: k, llama)
        state = load_file(str(d / "model.safetensors"))
        state[tensor] = cut(state[tensor]).contiguous()
        save_file(state, str(d / "model.safetensors"))
        with pytest.raises(LabError, match=message):
            read_checkpoint(d)
    bad = _foreign(tmp_path, drafter, "bad_t2d", lambda k: k, llama)
    state = load_file(str(bad / "model.safetensors"))
    state["t2d"] = torch.roll(state["t2d"], 1)
    save_file(state, str(bad / "model.safetensors"))
    assert main(["export", "--drafter", str(bad), "--format", "sglang", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad / "model.safetensors") in err[0] and "d2t and t2d disagree" in err[0]
    assert not (tmp_path / "out").exists()


def test_norm_before_residual_is_read_kept_and_never_exported_for_sglang(tmp_path, capsys):
    """speculators' variant (its default for the drafters it trains): vLLM serves it, SGLang has no switch."""
    drafter = random_drafter(small_config(norm_before_residual=True), seed=14, dtype=torch.float32)
    sp = _foreign(tmp_path, drafter, "sp", lambda k: k.replace("midlayer.", "layers.0."),
                  formats.speculators_config(drafter.config, torch.float32))
    assert json.loads((sp / "config.json").read_text())["norm_before_residual"] is True
    back = load_drafter(sp)
    assert back.config.norm_before_residual and back.midlayer.norm_before_residual
    assert_same_state(back, drafter)
    assert main(["export", "--drafter", str(sp), "--format", "speculators", "--out", str(tmp_path / "again")]) == 0
    assert load_drafter(tmp_path / "again").config == drafter.config
    capsys.readouterr()
    assert main(["export", "--drafter", str(sp), "--format", "sglang", "--out", str(tmp_path / "sg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(sp) in err[0] and "SGLang has no such switch" in err[0]
    assert not (tmp_path / "sg").exists()
    # a run directory (SGLang layout) keeps the switch for vLLM and for the lab; plain drafters write none
    save_drafter(drafter, tmp_path / "run")
    assert json.loads((tmp_path / "run/config.json").read_text())["norm_before_residual"] is True
    assert load_drafter(tmp_path / "run").config.norm_before_residual
    plain = random_drafter(small_config(), seed=14, dtype=torch.float32)
    save_drafter(plain, tmp_path / "plain")
    assert "norm_before_residual" not in json.loads((tmp_path / "plain/config.json").read_text())


def test_a_tied_flag_in_a_speculators_layer_config_is_not_refused(tmp_path):
    """vLLM's EAGLE-3 model builds its own head whatever tie_word_embeddings says (a verifier's layer
    config copied into a speculators file may carry it); only SGLang ties it to the embedding."""
    drafter = random_drafter(small_config(), seed=15, dtype=torch.float32)
    cfg = formats.speculators_config(drafter.config, torch.float32)
    cfg["transformer_layer_config"]["tie_word_embeddings"] = True
    sp = _foreign(tmp_path, drafter, "sp", lambda k: k.replace("midlayer.", "layers.0."), cfg)
    assert_same_state(load_drafter(sp), drafter)


def test_rope_scaling_is_read_from_either_layout_kept_and_checked(tmp_path):
    """SpecForge's Llama-3.1 drafters carry the target's llama3 scaling, which SGLang and vLLM apply:
    it is read (as rope_scaling, or transformers 5's rope_parameters), written back by every export, and
    a kind the reference does not implement is one line, never plain RoPE in disguise."""
    from .test_model import LLAMA3

    drafter = random_drafter(small_config(rope_scaling=LLAMA3), seed=15, dtype=torch.float32)
    sg = _foreign(tmp_path, drafter, "sg", lambda k: k, formats.sglang_config(drafter.config, torch.float32))
    assert json.loads((sg / "config.json").read_text())["rope_scaling"] == LLAMA3
    assert load_drafter(sg).config.rope_scaling == LLAMA3
    for fmt in FORMATS:
        export(sg, fmt, tmp_path / fmt)
        assert load_drafter(tmp_path / fmt).config == drafter.config
    layer = formats.sglang_config(small_config(), torch.float32)
    assert formats.parse_config(layer, "c")[0].rope_scaling is None
    as_v5 = {**layer, "rope_scaling": None, "rope_parameters": {**LLAMA3, "rope_theta": 500.0}}
    assert formats.parse_config(as_v5, "c")[0].rope_scaling == LLAMA3
    default_v5 = {**layer, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    assert formats.parse_config(default_v5, "c")[0].rope_scaling is None
    for scaling, problem in (({"rope_type": "yarn", "factor": 4.0}, "RoPE scaling 'yarn' is not supported"),
                             ({"type": "dynamic", "factor": 2.0}, "RoPE scaling 'dynamic' is not supported"),
                             ({"rope_type": "llama3", "factor": 8.0}, "llama3 RoPE scaling lacks low_freq_factor"),
                             ({**LLAMA3, "high_freq_factor": 1.0}, "needs high_freq_factor > low_freq_factor"),
                             ({"rope_type": "linear", "factor": 0}, "linear RoPE scaling needs factor > 0, got 0"),
                             ({**LLAMA3, "factor": -8.0}, "llama3 RoPE scaling needs factor > 0, got -8.0"),
                             ({**LLAMA3, "original_max_position_embeddings": 64.7},
                              "original_max_position_embeddings is 64.7, not a positive integer"),
                             ({**LLAMA3, "original_max_position_embeddings": 0},
                              "original_max_position_embeddings is 0, not a positive integer"),
                             ({"rope_type": ["llama3"]}, r"RoPE scaling \['llama3'\] is not supported"),
                             # true read as 1.0; an infinite factor zeroed every frequency; "2" lacked nothing
                             ({"rope_type": "linear", "factor": True}, "scaling's factor True is not a finite number"),
                             ({"rope_type": "linear", "factor": float("inf")}, "factor inf is not a finite number"),
                             ({"rope_type": "linear", "factor": "2"}, "factor '2' is not a finite number"),
                             ("linear", "rope_scaling is not a JSON object")):
        with pytest.raises(LabError, match=problem) as e:
            formats.parse_config({**layer, "rope_scaling": scaling}, tmp_path / "config.json")
        assert str(tmp_path / "config.json") in str(e.value)
    text = formats.rope_scaling_text(LLAMA3)
    assert formats.rope_scaling_from_text(text, "x") == LLAMA3 and formats.rope_scaling_text(None) == ""
    assert formats.rope_scaling_from_text("", "x") is None
    with pytest.raises(LabError, match="rope scaling is not JSON"):
        formats.rope_scaling_from_text("{llama3", "--drafter-rope-scaling")


def test_read_vocab_reads_the_two_vocab_tensors_alone(tmp_path, drafter, monkeypatch):
    """`vocab compare DIR` on a sharded drafter: d2t and t2d as read_checkpoint fills them in, without
    reading the weights (a Kimi-K2 drafter's embedding and head are gigabytes)."""
    import safetensors

    from drafter_lab.drafter.checkpoint import read_vocab

    state = {k: v.clone() for k, v in drafter.state_dict().items()}
    d = tmp_path / "sharded"
    d.mkdir()
    save_file({f"model.{k}": v for k, v in state.items() if k not in ("d2t", "t2d")}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"d2t": state["d2t"]}, str(d / "model-00002-of-00002.safetensors"))  # t2d left out: derived
    (d / "config.json").write_text(json.dumps(formats.sglang_config(drafter.config, torch.float32)))
    read = []
    real = safetensors.safe_open

    class Recording:
        def __init__(self, *a, **k):
            self.inner = real(*a, **k)

        def __enter__(self):
            self.fh = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.fh.keys()

        def get_tensor(self, k):
            read.append(k)
            return self.fh.get_tensor(k)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    vocab = read_vocab(d)
    assert sorted(read) == ["d2t"]
    assert torch.equal(vocab.d2t, drafter.d2t) and torch.equal(vocab.t2d, drafter.t2d)
    read.clear()
    full = read_checkpoint(d)
    assert len(read) == len(state) - 1 and torch.equal(full.tensors["t2d"], vocab.t2d)


def test_export_to_a_file_is_one_line(tmp_path, capsys):
    """Checked before the drafter is read: a nonexistent --drafter does not come first."""
    (tmp_path / "afile").write_text("")
    with pytest.raises(LabError, match=f"^{tmp_path / 'afile'}: output is a file"):
        export(tmp_path / "nothing", formats.SGLANG, tmp_path / "afile")
    assert main(["export", "--drafter", str(tmp_path), "--format", "sglang", "--out", str(tmp_path / "afile")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_run_record_that_is_not_text_is_one_line(tmp_path):
    """Bytes that are not UTF-8 were a UnicodeDecodeError out of the pairing check (eval, train --init-from)."""
    from drafter_lab.drafter.checkpoint import recorded_fingerprint

    (tmp_path / "run.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(LabError, match=f"^{tmp_path / 'run.json'}: not valid JSON$"):
        recorded_fingerprint(tmp_path)
    (tmp_path / "run.json").write_text('{"target": {"fingerprint": "abc"}}')
    assert recorded_fingerprint(tmp_path) == "abc"


@pytest.mark.parametrize("stale", ["model-00002-of-00002.safetensors", "model.safetensors"])
def test_a_tensor_in_two_weights_files_is_refused(tmp_path, drafter, stale):
    """Shards that overlap (a stale file beside a re-saved one) held the tensor twice, and the last file
    in name order won silently; so did two names of one tensor in one file (fc.weight, model.fc.weight)."""
    state = {k: v.clone() for k, v in drafter.state_dict().items()}
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(formats.sglang_config(drafter.config, torch.float32)))
    save_file(state, str(d / "model-00001-of-00002.safetensors"))
    save_file({"model.fc.weight": torch.zeros_like(state["fc.weight"])}, str(d / stale))
    where = "model-00001-of-00002.safetensors ('fc.weight') and " + f"{stale} ('model.fc.weight')"
    with pytest.raises(LabError, match=f"^{re.escape(str(d))}: tensor 'fc.weight' is in two places, {re.escape(where)}"):
        read_checkpoint(d)
    (d / stale).unlink()
    save_file({**state, "model.fc.weight": state["fc.weight"].clone()}, str(d / "model-00001-of-00002.safetensors"))
    with pytest.raises(LabError, match=re.escape("model-00001-of-00002.safetensors ('fc.weight') and "
                                                 "model-00001-of-00002.safetensors ('model.fc.weight')")):
        read_checkpoint(d)
