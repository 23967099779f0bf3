"""Mutation audit (review s64) of drafter/formats.py: how a config.json is told apart and read (defaults, types,
bounds), what a speculators config tells vLLM, and what each export writes."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError

from .test_model import small_config

CFG = small_config()


def _sglang(**over) -> dict:
    return {**formats.sglang_config(CFG, torch.float32), **over}


def _speculators(**over) -> dict:
    return {**formats.speculators_config(CFG, torch.float32), **over}


def _refusal(data) -> str:
    with pytest.raises(LabError) as e:
        formats.parse_config(data, "cfg.json")
    return str(e.value).removeprefix("cfg.json: ")


def test_a_speculators_config_is_told_by_its_model_type_alone():
    """speculators' own field marks its layout, as vLLM reads it, with no architectures list."""
    data = {k: v for k, v in _speculators().items() if k != "architectures"}
    assert formats.parse_config(data, "cfg.json") == (CFG, formats.SPECULATORS)


def test_a_minimal_config_reads_with_the_llama_defaults():
    """What a config leaves out is what transformers' LlamaConfig (and so SGLang and vLLM) take."""
    data = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "vocab_size": 100}
    cfg, _ = formats.parse_config(data, "cfg.json")
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps, cfg.rope_theta) == (4, 16, 1e-6, 10000.0)
    assert (cfg.draft_vocab_size, cfg.target_hidden_size, cfg.aux_layer_ids) == (100, 64, [])
    assert cfg.max_position_embeddings == DrafterConfig.max_position_embeddings


@pytest.mark.parametrize("data, problem", [
    (_sglang(hidden_size=48.0), "config's 'hidden_size' is 48.0, not a positive integer"),
    (_sglang(eagle_config={"eagle_aux_hidden_state_layer_ids": [True, 3, 4]}),
     "config's 'eagle_aux_hidden_state_layer_ids' is [True, 3, 4], not a list of integers"),
    (_sglang(eagle_config={**_sglang()["eagle_config"], "norm_before_fc": True}),
     "drafter variant norm_before_fc=true is not supported (plain EAGLE-3 only)"),
    (_sglang(eagle_config=None, eagle_aux_hidden_state_layer_ids=[1, 2]),
     "config's eagle_aux_hidden_state_layer_ids has 2 ids: an EAGLE-3 drafter's fc fuses the hidden states of "
     "exactly 3 layers (fc.weight is [hidden, 3 x target_hidden_size])"),
    (_sglang(vocab_size=2**31), "config's 'vocab_size' is 2147483648, past the 32-bit token ids of tokenizers and "
     "engines"),
])
def test_a_config_value_out_of_bounds_is_refused(data, problem):
    assert _refusal(data) == problem


def test_the_largest_32_bit_vocabulary_is_read():
    cfg, _ = formats.parse_config(_sglang(vocab_size=formats.MAX_VOCAB), "cfg.json")
    assert cfg.target_vocab_size == formats.MAX_VOCAB


def test_swish_is_silu():
    assert formats.parse_config(_sglang(hidden_act="swish"), "cfg.json") == (CFG, formats.SGLANG)


def test_a_two_layer_model_is_a_target_not_a_drafter():
    data = _sglang(architectures=["LlamaForCausalLM"], num_hidden_layers=2)
    assert _refusal(data) == "a target model (LlamaForCausalLM, 2 layers), not a drafter: give the drafter's directory"
    text = {k: v for k, v in data.items() if k != "num_hidden_layers"}  # a multimodal model's layers are its text's
    assert _refusal({**text, "text_config": {"num_hidden_layers": 40}}).startswith(
        "a target model (LlamaForCausalLM, 40 layers)")


def test_vllm_reads_the_first_proposals_draft_length():
    sc = _speculators()["speculators_config"]
    methods = [{**sc["proposal_methods"][0], "speculative_tokens": 3}, {"proposal_type": "tree", "speculative_tokens": 7}]
    data = _speculators(speculators_config={**sc, "proposal_methods": methods})
    assert formats.speculators_serving(data, "cfg.json")["speculative_tokens"] == 3
    methods[1]["speculative_tokens"] = None  # the other proposals are not read, nor checked
    assert formats.speculators_serving(data, "cfg.json")["speculative_tokens"] == 3


def test_a_verifier_name_of_blanks_is_refused():
    sc = _speculators()["speculators_config"]
    data = _speculators(speculators_config={**sc, "verifier": {"name_or_path": " ", "architectures": []}})
    with pytest.raises(LabError) as e:
        formats.speculators_serving(data, "cfg.json")
    assert str(e.value) == "cfg.json: config's verifier 'name_or_path' is ' ', not a model name or path"


@pytest.mark.parametrize("fmt", [formats.SGLANG, formats.SPECULATORS])
def test_each_weights_file_says_its_layout_and_our_aux_ids(tmp_path, fmt):
    """The safetensors metadata names the layout it holds and the aux ids in the lab's own convention (the
    config's eagle_config ids are one less)."""
    save_drafter(Eagle3Drafter(CFG), tmp_path, fmt)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta == {"format": "pt", "drafter_lab_layout": fmt, "aux_layer_ids_hf_hidden_states": "[2, 4, 5]"}
