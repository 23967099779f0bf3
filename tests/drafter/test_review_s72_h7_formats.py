"""Session 72, helper 7: formats.py mutation audit (constants, dropped statements, dropped returns)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError

CFG = DrafterConfig(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    draft_vocab_size=37, target_vocab_size=101, target_hidden_size=40, aux_layer_ids=[2, 4, 5],
                    rope_theta=500.0, rms_norm_eps=1e-5)


def _speculators() -> dict:
    return formats.speculators_config(CFG, torch.float32)


def test_a_null_model_type_in_a_speculators_layer_reads_as_llama():
    """HF configs write null for a field left unset; speculators' layer defaults its model_type to llama."""
    data = _speculators()
    data["transformer_layer_config"]["model_type"] = None
    assert formats.parse_config(data, "config.json") == (CFG, formats.SPECULATORS)
    del data["transformer_layer_config"]["model_type"]
    assert formats.parse_config(data, "config.json") == (CFG, formats.SPECULATORS)


def test_a_speculators_layer_of_another_model_type_is_still_refused():
    data = _speculators()
    data["transformer_layer_config"]["model_type"] = "mistral"
    with pytest.raises(LabError, match=r"^config.json: drafter layer model_type 'mistral' is not supported"):
        formats.parse_config(data, "config.json")


def test_the_int32_maximum_is_the_largest_vocabulary_read():
    """Spelled out, not formats.MAX_VOCAB: token ids are int32, so 2**31 - 1 itself is a valid size."""
    data = {**formats.sglang_config(CFG, torch.float32), "vocab_size": 2_147_483_647}
    assert formats.parse_config(data, "config.json")[0].target_vocab_size == 2_147_483_647


def test_an_unknown_layout_is_refused_not_written_as_a_null_config():
    with pytest.raises(LabError, match=r"unknown drafter format 'gguf'; known: sglang, speculators"):
        formats.config_for("gguf", CFG, torch.float32)


def test_a_linear_factor_of_at_most_one_is_read():
    """Only factor > 0 is needed (the frequencies are divided by it); 1.0 is plain RoPE written as linear."""
    for factor in (1.0, 0.5):
        assert formats.rope_scaling_of({"rope_scaling": {"rope_type": "linear", "factor": factor}}, "c") == {
            "rope_type": "linear", "factor": factor}


def test_a_llama3_original_context_of_one_position_is_read():
    """The smallest positive integer is a valid original_max_position_embeddings; 0 is refused (test_formats)."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1}
    assert formats.rope_scaling_from_text(formats.rope_scaling_text(scaling), "--drafter-rope-scaling") == scaling


def test_an_sglang_export_without_aux_ids_names_no_layers():
    """SGLang captures its default layers only when eagle_config names none: an empty list would capture no
    hidden state at all (its set_eagle3_layers_to_capture takes [] as the layers to capture)."""
    data = formats.sglang_config(dataclasses.replace(CFG, aux_layer_ids=[]), torch.float32)
    assert "eagle_config" not in data and "eagle_aux_hidden_state_layer_ids" not in data
    assert formats.parse_config(data, "config.json")[0].aux_layer_ids == []


@pytest.mark.parametrize("verifier", [{"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]},
                                      {"name_or_path": "", "architectures": "LlamaForCausalLM"}])
def test_a_verifier_that_a_flag_sets_is_left_unread(verifier):
    """`export --verifier` replaces the source's: neither carried nor checked, even when malformed."""
    data = _speculators()
    data["speculators_config"]["verifier"] = verifier
    assert formats.speculators_serving(data, "config.json", ("speculative_tokens",)) == {
        "speculative_tokens": formats.SPECULATIVE_TOKENS}
