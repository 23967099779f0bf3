"""Second mutation audit of drafter/formats.py (s78 h12): the config writers."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError


def test_a_drafter_without_recorded_aux_layers_writes_none_for_sglang():
    """No ids recorded: the config says nothing, so SGLang and vLLM capture their default layers (an empty list
    would ask them to capture none)."""
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        draft_vocab_size=16, target_vocab_size=64, target_hidden_size=32, aux_layer_ids=[])
    out = formats.sglang_config(cfg, torch.float32)
    assert "eagle_config" not in out and "eagle_aux_hidden_state_layer_ids" not in out
    assert formats.speculators_config(cfg, torch.float32)["eagle_aux_hidden_state_layer_ids"] is None
    assert formats.parse_config(out, "config.json") == (cfg, formats.SGLANG)


def test_the_largest_vocab_a_config_may_name_is_the_largest_int32():
    layer = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "draft_vocab_size": 16}
    cfg, _ = formats.parse_config({**layer, "vocab_size": 2**31 - 1}, "config.json")
    assert cfg.target_vocab_size == 2**31 - 1
    with pytest.raises(LabError) as e:
        formats.parse_config({**layer, "vocab_size": 2**31}, "config.json")
    assert str(e.value) == ("config.json: config's 'vocab_size' is 2147483648, past the 32-bit token ids of tokenizers "
                            "and engines")
